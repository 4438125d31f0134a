"""The blocking client."""

from __future__ import annotations

import json
import threading
import time
from typing import Any, Callable, Iterable, Iterator, Optional, Union

import httpx

from ._common import (Done, Failed, SseParser, answer, backoff, check_tenant, path, stream_params,
                      with_ids)
from ._errors import ApiError, TidemarkError, TransportError
from ._operations import Ops

FATAL_STREAM = {400, 401, 403, 410}


class Client:
    """A tidemark server at ``base_url`` (``http://host:port``), with a bearer ``token`` when
    the server has tokens configured."""

    def __init__(self, base_url: str, token: Optional[str] = None, *, timeout: float = 30.0,
                 attempts: int = 8, max_retry_after: float = 60.0):
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"the base URL must start with http:// or https:// (got {base_url!r})")
        self.base_url = base_url.rstrip("/")
        self._settings = (token, timeout, attempts, max_retry_after)
        headers = {"authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout)
        self.attempts = max(1, attempts)
        self.max_retry_after = max_retry_after
        #: Every JSON operation of the API, one call each (generated from the checked-in
        #: OpenAPI document by clients/codegen.py): ``client.ops.put_route("rot", {...})``.
        self.ops = Ops(self._op)

    def tenant(self, name: str) -> "Client":
        """A client of the same server acting for tenant ``name`` (spec section 20): every call
        goes under ``/tenants/{name}``, with the same token (a ``*`` token's, or the tenant's
        own). A name is 1 to 32 of ``a-z0-9_-``, starting with a letter."""
        check_tenant(name)
        token, timeout, attempts, max_retry_after = self._settings
        return Client(f"{self.base_url}/tenants/{name}", token, timeout=timeout, attempts=attempts,
                      max_retry_after=max_retry_after)

    def _op(self, method: str, url: str, query: dict, allowed: tuple, body: Any) -> Any:
        kw: dict[str, Any] = {"params": _query(method, url, query, allowed)}
        if body is not None:
            kw["json"] = body
        return self._call(method, url, **kw)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _call(self, method: str, url: str, **kw: Any) -> Any:
        try:
            resp = self._http.request(method, url, **kw)
        except httpx.TransportError as e:
            raise TransportError(str(e)) from e
        return answer(resp)

    # Appends

    def append(self, events: Iterable[dict[str, Any]]) -> dict[str, Any]:
        """Append ``events`` atomically; each without an ``event_id`` is given one first. A lost
        answer, a 5xx or a 429 (after its ``Retry-After``) is retried with the same ids, so a
        retry of a batch that landed is answered ``duplicate: true`` with the original seqs."""
        body = json.dumps({"events": with_ids(events)}).encode()
        attempt = 0
        while True:
            try:
                return self._call("POST", "/v1/events", content=body,
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
                time.sleep(wait)

    # Reads

    def events(self, after_sequence: int = 0, *, stream: Optional[str] = None,
               subject: Optional[str] = None, limit: int = 100) -> dict[str, Any]:
        p = stream_params(after_sequence, stream, subject, None)
        p["limit"] = limit
        return self._call("GET", "/v1/events", params=p)

    def stream(self, after_sequence: int = 0, *, stream: Optional[str] = None,
               subject: Optional[str] = None, type: Optional[str] = None,
               stop: Optional[threading.Event] = None) -> Iterator[dict[str, Any]]:
        """The events after ``after_sequence``, live: after any failure it reconnects with
        ``Last-Event-ID`` (jittered backoff) and yields each seq once, in order. Ends when
        ``stop`` is set (checked between messages and keep-alives) or on a problem no retry
        fixes (400, 401, 403, 410), which is raised."""
        last = after_sequence
        failures = 0
        first = True
        while stop is None or not stop.is_set():
            headers = {"accept": "text/event-stream"}
            if not first:
                headers["last-event-id"] = str(last)
            first = False
            before = last
            wait_for: Optional[float] = None
            try:
                with self._http.stream("GET", "/v1/events/stream",
                                       params=stream_params(last, stream, subject, type),
                                       headers=headers, timeout=httpx.Timeout(30.0, read=60.0)) as resp:
                    if resp.status_code != 200:
                        resp.read()
                        try:
                            answer(resp)
                        except ApiError as e:
                            if e.status in FATAL_STREAM:
                                raise
                            wait_for = e.retry_after
                    else:
                        parser = SseParser()
                        for line in resp.iter_lines():
                            if stop is not None and stop.is_set():
                                return
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
            if stop is not None:
                if stop.wait(wait):
                    return
            else:
                time.sleep(wait)

    # Cursors

    def cursor(self, consumer_id: str, stream_name: str, subject_id: str = "") -> dict[str, Any]:
        page = self._call("GET", "/v1/cursors", params={
            "consumer_id": consumer_id, "stream_name": stream_name, "subject_id": subject_id})
        return page["cursors"][0]

    def advance_cursor(self, consumer_id: str, stream_name: str, last_sequence: int,
                       delivery_id: str, *, subject_id: str = "",
                       expected_sequence: Optional[int] = None) -> dict[str, Any]:
        body: dict[str, Any] = {"consumer_id": consumer_id, "stream_name": stream_name,
                                "subject_id": subject_id, "last_sequence": last_sequence,
                                "delivery_id": delivery_id}
        if expected_sequence is not None:
            body["expected_sequence"] = expected_sequence
        return self._call("POST", "/v1/cursors/advance", json=body)

    # Deliveries

    def claim(self, sink: str, owner: str, limit: int = 10, lease_ms: int = 30_000) -> list:
        return self._call("POST", "/v1/deliveries/claim", json={
            "sink": sink, "owner": owner, "limit": limit, "lease_ms": lease_ms})["deliveries"]

    def complete(self, owner: str, ids: list[str]) -> list:
        return self._call("POST", "/v1/deliveries/complete", json={
            "owner": owner, "deliveries": [{"id": i} for i in ids]})["results"]

    def fail(self, id: str, owner: str, failure: Failed) -> dict[str, Any]:
        return self._call("POST", f"/v1/deliveries/{path(id)}/fail", json=failure.body(owner))

    def extend(self, id: str, owner: str, lease_ms: int) -> dict[str, Any]:
        return self._call("POST", f"/v1/deliveries/{path(id)}/extend",
                          json={"owner": owner, "lease_ms": lease_ms})

    def delivery(self, id: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/deliveries/{path(id)}")

    # Loops

    def consumer(self, consumer_id: str, stream_name: str, subject_id: str = "", *,
                 page: int = 100, idle: float = 0.25) -> "Consumer":
        return Consumer(self, consumer_id, stream_name, subject_id, page, idle)

    def worker(self, sink: str, owner: str, *, limit: int = 10, lease_ms: int = 30_000,
               idle: float = 0.25) -> "Worker":
        return Worker(self, sink, owner, limit, lease_ms, idle)


def _query(method: str, url: str, query: dict, allowed: tuple) -> dict:
    """The query of an operation: only the names the document gives it, ``None`` left out,
    booleans as ``true``/``false``."""
    out = {}
    for k, v in query.items():
        if k not in allowed:
            raise TypeError(f"{method} {url} takes no query parameter {k!r} (it takes {allowed})")
        if v is None:
            continue
        out[k] = ("true" if v else "false") if isinstance(v, bool) else v
    return out


class Consumer:
    """A bridge's cursor loop: each page after the stored cursor to ``handler``, the cursor
    advanced only after it returns. After a crash it resumes from the stored cursor: every
    event handled at least once, in seq order."""

    def __init__(self, client: Client, consumer_id: str, stream_name: str, subject_id: str,
                 page: int, idle: float):
        self.client, self.consumer_id, self.stream_name = client, consumer_id, stream_name
        self.subject_id, self.page, self.idle = subject_id, page, idle

    def run(self, handler: Callable[[list], Any], stop: Optional[threading.Event] = None) -> int:
        stop = stop or threading.Event()
        at: Optional[int] = None
        failures = 0
        while not stop.is_set():
            try:
                if at is None:
                    at = self.client.cursor(self.consumer_id, self.stream_name,
                                            self.subject_id)["last_sequence"]
                page = self.client.events(at, stream=self.stream_name,
                                          subject=self.subject_id or None, limit=self.page)
                evs = page["events"]
                if not evs:
                    failures = 0
                    stop.wait(self.idle)
                    continue
                handler(evs)
                top = evs[-1]["seq"]
                try:
                    c = self.client.advance_cursor(
                        self.consumer_id, self.stream_name, top, f"client:{top}",
                        subject_id=self.subject_id, expected_sequence=at)
                    at = c["last_sequence"]
                except ApiError as e:
                    if e.status != 409:
                        raise
                    at = None
                failures = 0
            except ApiError as e:
                if not e.retryable:
                    raise
                at = None
                failures += 1
                stop.wait(backoff(failures - 1))
            except TransportError:
                at = None
                failures += 1
                stop.wait(backoff(failures - 1))
        return at or 0


class Worker:
    """A sink's claim loop: claim up to ``limit``, extend the leases while ``handler`` runs,
    complete (in one batch) or fail with its outcome; on ``stop`` the unstarted rows are
    handed back (failed retryable with no wait, code ``worker_stopped``)."""

    def __init__(self, client: Client, sink: str, owner: str, limit: int, lease_ms: int,
                 idle: float):
        self.client, self.sink, self.owner = client, sink, owner
        self.limit, self.lease_ms, self.idle = limit, lease_ms, idle

    def run(self, handler: Callable[[dict], Union[Done, Failed]],
            stop: Optional[threading.Event] = None) -> dict[str, int]:
        stop = stop or threading.Event()
        report = {"completed": 0, "failed": 0, "released": 0, "refused": 0}
        failures = 0
        while not stop.is_set():
            try:
                rows = self.client.claim(self.sink, self.owner, self.limit, self.lease_ms)
                failures = 0
            except TidemarkError as e:
                if not e.retryable:
                    raise
                failures += 1
                stop.wait(backoff(failures - 1))
                continue
            if not rows:
                stop.wait(self.idle)
                continue
            held = {r["id"] for r in rows}
            lock = threading.Lock()
            beat_stop = threading.Event()

            def beat() -> None:
                while not beat_stop.wait(max(0.05, self.lease_ms / 3000)):
                    with lock:
                        ids = list(held)
                    for i in ids:
                        try:
                            self.client.extend(i, self.owner, self.lease_ms)
                        except TidemarkError:
                            pass

            t = threading.Thread(target=beat, daemon=True)
            t.start()
            done: list[str] = []
            rest = list(rows)
            # Ctrl-C (KeyboardInterrupt) stops the worker as `stop` does: the rows handled are
            # still reported and the unstarted ones handed back, then it is raised again.
            interrupted: Optional[BaseException] = None
            try:
                while rest:
                    d = rest[0]
                    out = handler(d)
                    rest.pop(0)
                    if isinstance(out, Failed):
                        try:
                            _retried(lambda: self.client.fail(d["id"], self.owner, out))
                            report["failed"] += 1
                        except TidemarkError:
                            report["refused"] += 1
                        with lock:
                            held.discard(d["id"])
                    else:
                        done.append(d["id"])
                    if stop.is_set():
                        break
            except KeyboardInterrupt as e:
                interrupted = e
                stop.set()
            # What the handlers did is reported even when Ctrl-C comes meanwhile: a report cut
            # short is sent again (both calls are safe to repeat), a second Ctrl-C is raised.
            for d in rest:
                try:
                    _shielded(lambda d=d: _retried(lambda: self.client.fail(
                        d["id"], self.owner, Failed(
                            "worker_stopped",
                            "the worker stopped before it started this delivery", True, 0))),
                        report)
                    report["released"] += 1
                except TidemarkError:
                    report["refused"] += 1
                with lock:
                    held.discard(d["id"])
            try:
                if done:
                    # The server may be restarting: a completion is safe to repeat.
                    for r in _shielded(
                            lambda: _retried(lambda: self.client.complete(self.owner, done)),
                            report):
                        report["completed" if r["status"] == 200 else "refused"] += 1
            finally:
                beat_stop.set()
                t.join()
            if interrupted is None:
                interrupted = report.pop("_interrupted", None)
            if interrupted is not None:
                raise interrupted
        return report


def _shielded(call: Callable[[], Any], report: dict) -> Any:
    """``call()``; when Ctrl-C cuts it short, once more (noted in ``report`` to raise later)."""
    try:
        return call()
    except KeyboardInterrupt as e:
        report["_interrupted"] = e
        return call()


def _retried(call: Callable[[], Any], attempts: int = 12) -> Any:
    """``call()`` again while it fails with what a retry may fix, with a jittered backoff."""
    for attempt in range(attempts):
        try:
            return call()
        except TidemarkError as e:
            if not e.retryable or attempt + 1 >= attempts:
                raise
            wait = backoff(attempt, 0.1, 5.0)
            if isinstance(e, ApiError) and e.retry_after is not None:
                wait = max(wait, e.retry_after)
            time.sleep(wait)
