"""What the sync and the asyncio clients share: request shapes, answers, backoff."""

from __future__ import annotations

import email.utils
import random
import re
import time
import uuid
from dataclasses import dataclass
from typing import Any, Iterable, Optional

import httpx

from ._errors import ApiError


TENANT = re.compile(r"[a-z][a-z0-9_-]{0,31}")


def check_tenant(name: str) -> None:
    """Refuse what is not a tenant's name before any request is sent."""
    if not isinstance(name, str) or TENANT.fullmatch(name) is None:
        raise ValueError(
            f"{name!r} is not a tenant's name (1 to 32 of a-z0-9_-, starting with a letter)")


def with_ids(events: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events, each without an ``event_id`` given a UUIDv7 (time-ordered) one."""
    out = []
    for e in events:
        e = dict(e)
        if not e.get("event_id"):
            e["event_id"] = str(uuid7())
        out.append(e)
    return out


def uuid7() -> uuid.UUID:
    ms = time.time_ns() // 1_000_000
    rand = random.getrandbits(74)
    value = (ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76
    value |= (rand >> 62) << 64  # 12 bits rand_a
    value |= 0b10 << 62
    value |= rand & ((1 << 62) - 1)
    return uuid.UUID(int=value)


def retry_after(resp: httpx.Response) -> Optional[float]:
    v = resp.headers.get("retry-after")
    if not v:
        return None
    v = v.strip()
    if v.isdigit():
        return float(v)
    try:
        at = email.utils.parsedate_to_datetime(v)
    except (TypeError, ValueError):
        return None
    return max(0.0, at.timestamp() - time.time())


def answer(resp: httpx.Response) -> Any:
    """The JSON of a 2xx answer, or the problem raised as an :class:`ApiError`."""
    if 200 <= resp.status_code < 300:
        return resp.json()
    try:
        problem = resp.json()
        if not isinstance(problem, dict):
            problem = {"detail": str(problem)}
    except ValueError:
        problem = {"detail": resp.text[:512]}
    raise ApiError(resp.status_code, problem, retry_after(resp))


def backoff(attempt: int, base: float = 0.1, cap: float = 10.0) -> float:
    """A jittered exponential wait, from the upper half so clients restarted together spread."""
    exp = min(cap, base * (2 ** min(attempt, 16)))
    return exp / 2 + random.random() * exp / 2


@dataclass
class Done:
    """A worker handler's outcome: delivered."""


@dataclass
class Failed:
    """A worker handler's outcome: not delivered. ``retryable=False`` parks the delivery."""

    code: str
    message: Optional[str] = None
    retryable: bool = True
    retry_after_ms: Optional[int] = None

    def body(self, owner: str) -> dict[str, Any]:
        b: dict[str, Any] = {"owner": owner, "error_code": self.code, "retryable": self.retryable}
        if self.message is not None:
            b["error"] = self.message
        if self.retry_after_ms is not None:
            b["retry_after_ms"] = self.retry_after_ms
        return b


def stream_params(after: int, stream: Optional[str], subject: Optional[str], type_: Optional[str]):
    p: dict[str, Any] = {"after_sequence": after}
    if stream:
        p["stream"] = stream
    if subject:
        p["subject"] = subject
    if type_:
        p["type"] = type_
    return p


class SseParser:
    """Server-Sent Events, line by line: the ``data`` of each message (the envelope carries
    the seq and the type)."""

    def __init__(self) -> None:
        self.data: list[str] = []

    def feed(self, line: str) -> Optional[str]:
        line = line.rstrip("\r\n")
        if line == "":
            if not self.data:
                return None
            out = "\n".join(self.data)
            self.data = []
            return out
        if line.startswith("data:"):
            v = line[5:]
            self.data.append(v[1:] if v.startswith(" ") else v)
        return None


def path(id_: str) -> str:
    from urllib.parse import quote

    return quote(id_, safe=":")
