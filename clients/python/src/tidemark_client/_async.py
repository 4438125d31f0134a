"""The asyncio client: the same calls and loops as :class:`tidemark_client.Client`."""

from __future__ import annotations

import asyncio
import json
from typing import Any, AsyncIterator, Awaitable, Callable, Iterable, Optional, Union

import httpx

from ._common import (Done, Failed, SseParser, answer, backoff, check_tenant, path, stream_params,
                      with_ids)
from ._errors import ApiError, TidemarkError, TransportError
from ._operations import AsyncOps
from ._sync import FATAL_STREAM, _query


class AsyncClient:
    """A tidemark server at ``base_url``, for asyncio programs."""

    def __init__(self, base_url: str, token: Optional[str] = None, *, timeout: float = 30.0,
                 attempts: int = 8, max_retry_after: float = 60.0):
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"the base URL must start with http:// or https:// (got {base_url!r})")
        self.base_url = base_url.rstrip("/")
        self._settings = (token, timeout, attempts, max_retry_after)
        headers = {"authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.AsyncClient(base_url=self.base_url, headers=headers, timeout=timeout)
        self.attempts = max(1, attempts)
        self.max_retry_after = max_retry_after
        #: Every JSON operation of the API, one coroutine each (generated): ``await
        #: client.ops.put_route("rot", {...})``.
        self.ops = AsyncOps(self._op)

    def tenant(self, name: str) -> "AsyncClient":
        """A client of the same server acting for tenant ``name`` (spec section 20): every call
        goes under ``/tenants/{name}``, with the same token (a ``*`` token's, or the tenant's
        own). A name is 1 to 32 of ``a-z0-9_-``, starting with a letter."""
        check_tenant(name)
        token, timeout, attempts, max_retry_after = self._settings
        return AsyncClient(f"{self.base_url}/tenants/{name}", token, timeout=timeout, attempts=attempts,
                      max_retry_after=max_retry_after)

    async def _op(self, method: str, url: str, query: dict, allowed: tuple, body: Any) -> Any:
        kw: dict[str, Any] = {"params": _query(method, url, query, allowed)}
        if body is not None:
            kw["json"] = body
        return await self._call(method, url, **kw)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def _call(self, method: str, url: str, **kw: Any) -> Any:
        try:
            resp = await self._http.request(method, url, **kw)
        except httpx.TransportError as e:
            raise TransportError(str(e)) from e
        return answer(resp)

    async def append(self, events: Iterable[dict[str, Any]]) -> dict[str, Any]:
        """See :meth:`tidemark_client.Client.append`."""
        body = json.dumps({"events": with_ids(events)}).encode()
        attempt = 0
        while True:
            try:
                return await self._call("POST", "/v1/events", content=body,
                                        headers={"content-type": "application/json"})
            except TidemarkError as e:
                attempt += 1
                if not e.retryable or attempt >= self.attempts:
                    raise
                wait = backoff(attempt - 1, 0.1, 5.0)
                if isinstance(e, ApiError) and e.retry_after is not None:
                    if e.retry_after > self.max_retry_after:
                        raise
                    wait = max(wait, e.retry_after)
                await asyncio.sleep(wait)

    async def events(self, after_sequence: int = 0, *, stream: Optional[str] = None,
                     subject: Optional[str] = None, limit: int = 100) -> dict[str, Any]:
        p = stream_params(after_sequence, stream, subject, None)
        p["limit"] = limit
        return await self._call("GET", "/v1/events", params=p)

    async def stream(self, after_sequence: int = 0, *, stream: Optional[str] = None,
                     subject: Optional[str] = None,
                     type: Optional[str] = None) -> AsyncIterator[dict[str, Any]]:
        """See :meth:`tidemark_client.Client.stream`; ends when the caller stops iterating
        (or cancels its task)."""
        last = after_sequence
        failures = 0
        first = True
        while True:
            headers = {"accept": "text/event-stream"}
            if not first:
                headers["last-event-id"] = str(last)
            first = False
            before = last
            wait_for: Optional[float] = None
            try:
                async with self._http.stream(
                        "GET", "/v1/events/stream",
                        params=stream_params(last, stream, subject, type), headers=headers,
                        timeout=httpx.Timeout(30.0, read=60.0)) as resp:
                    if resp.status_code != 200:
                        await resp.aread()
                        try:
                            answer(resp)
                        except ApiError as e:
                            if e.status in FATAL_STREAM:
                                raise
                            wait_for = e.retry_after
                    else:
                        parser = SseParser()
                        async for line in resp.aiter_lines():
                            data = parser.feed(line)
                            if data is None:
                                continue
                            ev = json.loads(data)
                            if ev["seq"] <= last:
                                continue
                            last = ev["seq"]
                            yield ev
            except httpx.TransportError:
                pass
            if last > before:
                failures = 0
            wait = backoff(failures, 0.1, 10.0)
            failures += 1
            if wait_for is not None:
                wait = max(wait, wait_for)
            await asyncio.sleep(wait)

    async def cursor(self, consumer_id: str, stream_name: str, subject_id: str = "") -> dict:
        page = await self._call("GET", "/v1/cursors", params={
            "consumer_id": consumer_id, "stream_name": stream_name, "subject_id": subject_id})
        return page["cursors"][0]

    async def advance_cursor(self, consumer_id: str, stream_name: str, last_sequence: int,
                             delivery_id: str, *, subject_id: str = "",
                             expected_sequence: Optional[int] = None) -> dict[str, Any]:
        body: dict[str, Any] = {"consumer_id": consumer_id, "stream_name": stream_name,
                                "subject_id": subject_id, "last_sequence": last_sequence,
                                "delivery_id": delivery_id}
        if expected_sequence is not None:
            body["expected_sequence"] = expected_sequence
        return await self._call("POST", "/v1/cursors/advance", json=body)

    async def claim(self, sink: str, owner: str, limit: int = 10, lease_ms: int = 30_000) -> list:
        return (await self._call("POST", "/v1/deliveries/claim", json={
            "sink": sink, "owner": owner, "limit": limit, "lease_ms": lease_ms}))["deliveries"]

    async def complete(self, owner: str, ids: list[str]) -> list:
        return (await self._call("POST", "/v1/deliveries/complete", json={
            "owner": owner, "deliveries": [{"id": i} for i in ids]}))["results"]

    async def fail(self, id: str, owner: str, failure: Failed) -> dict[str, Any]:
        return await self._call("POST", f"/v1/deliveries/{path(id)}/fail",
                                json=failure.body(owner))

    async def extend(self, id: str, owner: str, lease_ms: int) -> dict[str, Any]:
        return await self._call("POST", f"/v1/deliveries/{path(id)}/extend",
                                json={"owner": owner, "lease_ms": lease_ms})

    async def delivery(self, id: str) -> dict[str, Any]:
        return await self._call("GET", f"/v1/deliveries/{path(id)}")

    def consumer(self, consumer_id: str, stream_name: str, subject_id: str = "", *,
                 page: int = 100, idle: float = 0.25) -> "AsyncConsumer":
        return AsyncConsumer(self, consumer_id, stream_name, subject_id, page, idle)

    def worker(self, sink: str, owner: str, *, limit: int = 10, lease_ms: int = 30_000,
               idle: float = 0.25) -> "AsyncWorker":
        return AsyncWorker(self, sink, owner, limit, lease_ms, idle)


async def _wait(stop: asyncio.Event, secs: float) -> bool:
    try:
        await asyncio.wait_for(stop.wait(), secs)
        return True
    except asyncio.TimeoutError:
        return False


class AsyncConsumer:
    """See :class:`tidemark_client.Consumer`; the handler is a coroutine function."""

    def __init__(self, client: AsyncClient, consumer_id: str, stream_name: str,
                 subject_id: str, page: int, idle: float):
        self.client, self.consumer_id, self.stream_name = client, consumer_id, stream_name
        self.subject_id, self.page, self.idle = subject_id, page, idle

    async def run(self, handler: Callable[[list], Awaitable[Any]],
                  stop: Optional[asyncio.Event] = None) -> int:
        stop = stop or asyncio.Event()
        at: Optional[int] = None
        failures = 0
        while not stop.is_set():
            try:
                if at is None:
                    at = (await self.client.cursor(self.consumer_id, self.stream_name,
                                                   self.subject_id))["last_sequence"]
                page = await self.client.events(at, stream=self.stream_name,
                                                subject=self.subject_id or None,
                                                limit=self.page)
                evs = page["events"]
                if not evs:
                    failures = 0
                    await _wait(stop, self.idle)
                    continue
                await handler(evs)
                top = evs[-1]["seq"]
                try:
                    c = await self.client.advance_cursor(
                        self.consumer_id, self.stream_name, top, f"client:{top}",
                        subject_id=self.subject_id, expected_sequence=at)
                    at = c["last_sequence"]
                except ApiError as e:
                    if e.status != 409:
                        raise
                    at = None
                failures = 0
            except TidemarkError as e:
                if isinstance(e, ApiError) and not e.retryable:
                    raise
                at = None
                failures += 1
                await _wait(stop, backoff(failures - 1))
        return at or 0


class AsyncWorker:
    """See :class:`tidemark_client.Worker`; the handler is a coroutine function."""

    def __init__(self, client: AsyncClient, sink: str, owner: str, limit: int, lease_ms: int,
                 idle: float):
        self.client, self.sink, self.owner = client, sink, owner
        self.limit, self.lease_ms, self.idle = limit, lease_ms, idle

    async def run(self, handler: Callable[[dict], Awaitable[Union[Done, Failed]]],
                  stop: Optional[asyncio.Event] = None) -> dict[str, int]:
        stop = stop or asyncio.Event()
        report = {"completed": 0, "failed": 0, "released": 0, "refused": 0}
        failures = 0
        while not stop.is_set():
            try:
                rows = await self.client.claim(self.sink, self.owner, self.limit, self.lease_ms)
                failures = 0
            except TidemarkError as e:
                if not e.retryable:
                    raise
                failures += 1
                await _wait(stop, backoff(failures - 1))
                continue
            if not rows:
                await _wait(stop, self.idle)
                continue
            held = {r["id"] for r in rows}

            async def beat() -> None:
                while True:
                    await asyncio.sleep(max(0.05, self.lease_ms / 3000))
                    for i in list(held):
                        try:
                            await self.client.extend(i, self.owner, self.lease_ms)
                        except TidemarkError:
                            pass

            beating = asyncio.create_task(beat())
            done: list[str] = []
            rest = list(rows)
            try:
                while rest:
                    d = rest.pop(0)
                    out = await handler(d)
                    if isinstance(out, Failed):
                        try:
                            await _retried(lambda: self.client.fail(d["id"], self.owner, out))
                            report["failed"] += 1
                        except TidemarkError:
                            report["refused"] += 1
                        held.discard(d["id"])
                    else:
                        done.append(d["id"])
                    if stop.is_set():
                        break
                for d in rest:
                    try:
                        await _retried(lambda: self.client.fail(d["id"], self.owner, Failed(
                            "worker_stopped",
                            "the worker stopped before it started this delivery", True, 0)))
                        report["released"] += 1
                    except TidemarkError:
                        report["refused"] += 1
                    held.discard(d["id"])
                if done:
                    # The server may be restarting: a completion is safe to repeat.
                    for r in await _retried(lambda: self.client.complete(self.owner, done)):
                        report["completed" if r["status"] == 200 else "refused"] += 1
            finally:
                beating.cancel()
        return report


async def _retried(call: Callable[[], Awaitable[Any]], attempts: int = 12) -> Any:
    """``await call()`` again while it fails with what a retry may fix, with a backoff."""
    for attempt in range(attempts):
        try:
            return await call()
        except TidemarkError as e:
            if not e.retryable or attempt + 1 >= attempts:
                raise
            wait = backoff(attempt, 0.1, 5.0)
            if isinstance(e, ApiError) and e.retry_after is not None:
                wait = max(wait, e.retry_after)
            await asyncio.sleep(wait)
