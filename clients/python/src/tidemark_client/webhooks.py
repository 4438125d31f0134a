"""Verifying tidemark's webhook POSTs (Standard Webhooks): ``webhook-id``,
``webhook-timestamp`` and ``webhook-signature: v1,<base64>`` (several, space-separated, during
a secret's rotation), each an HMAC-SHA256 of ``"<id>.<timestamp>.<body>"``. The key is the
secret's UTF-8 bytes, or for a secret written ``whsec_<base64>`` the decoded bytes."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import time
from typing import Iterable, Mapping, Optional, Union

TOLERANCE_S = 300


class WebhookVerificationError(Exception):
    """The POST does not verify (the message says why)."""


def _key(secret: str) -> bytes:
    if secret.startswith("whsec_"):
        try:
            return base64.b64decode(secret[6:], validate=True)
        except (binascii.Error, ValueError):
            pass
    return secret.encode()


def sign(secret: str, webhook_id: str, timestamp: int, body: bytes) -> str:
    mac = hmac.new(_key(secret), f"{webhook_id}.{timestamp}.".encode() + body, hashlib.sha256)
    return "v1," + base64.b64encode(mac.digest()).decode()


def verify_webhook(secret: Union[str, Iterable[str]], headers: Mapping[str, str], body: bytes,
                   *, now: Optional[float] = None, tolerance_s: int = TOLERANCE_S) -> None:
    """Raise :class:`WebhookVerificationError` unless ``body`` (the exact bytes) and
    ``headers`` carry a signature under ``secret`` (or any of several: the current and, during
    a rotation, the previous) and a timestamp within ``tolerance_s`` of now."""
    lower = {k.lower(): v for k, v in headers.items()}
    for h in ("webhook-id", "webhook-timestamp", "webhook-signature"):
        if h not in lower:
            raise WebhookVerificationError(f"the {h} header is missing")
    try:
        ts = int(lower["webhook-timestamp"].strip())
    except ValueError:
        raise WebhookVerificationError("webhook-timestamp is not a number of seconds") from None
    if abs((now if now is not None else time.time()) - ts) > tolerance_s:
        raise WebhookVerificationError("webhook-timestamp is further than the tolerance from now")
    secrets = [secret] if isinstance(secret, str) else list(secret)
    given = [s[3:] for s in lower["webhook-signature"].split() if s.startswith("v1,")]
    for sec in secrets:
        want = sign(sec, lower["webhook-id"], ts, body)[3:]
        if any(hmac.compare_digest(want, g) for g in given):
            return
    raise WebhookVerificationError("no signature matches any of the secrets")
