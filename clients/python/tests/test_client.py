"""The Python client against the real server: a lost answer resent as a duplicate, a 429
waited out, a stream across ``kill -9`` (sync and asyncio), a consumer crashed between its
handler and its advance and under a server kill, a worker's heartbeat, failures and shutdown,
and tidemark's own webhook POSTs verified under both keys of a rotation."""

from __future__ import annotations

import asyncio
import hashlib
import http.server
import secrets
import socket
import threading
import time

import typing

import httpx
import pytest

from tidemark_client import models
from tidemark_client._operations import AsyncOps, Ops
from tidemark_client import (
    ApiError,
    AsyncClient,
    Client,
    Done,
    Failed,
    WebhookVerificationError,
    verify_webhook,
)


def ev(stream: str, subject: str, i: int) -> dict:
    return {"stream": stream, "subject": subject, "type": "client.test", "payload": {"i": i}}


def answer_losing_relay(upstream_port: int) -> tuple[int, list]:
    """A TCP relay whose first connection passes the request on and is dropped when the answer
    starts: the append lands, its answer is lost. Later connections are relayed whole."""
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen()
    lost: list = []

    def pipe(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def serve() -> None:
        first = True
        while True:
            c, _ = lsock.accept()
            u = socket.create_connection(("127.0.0.1", upstream_port))
            if first:
                first = False

                def drop(c=c, u=u) -> None:
                    threading.Thread(target=pipe, args=(c, u), daemon=True).start()
                    u.recv(1)  # the answer starts
                    lost.append(1)
                    c.close()
                    u.close()

                threading.Thread(target=drop, daemon=True).start()
            else:
                threading.Thread(target=pipe, args=(c, u), daemon=True).start()
                threading.Thread(target=pipe, args=(u, c), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return lsock.getsockname()[1], lost


def test_an_append_whose_answer_is_lost_is_resent_and_answered_as_a_duplicate(server):
    port, lost = answer_losing_relay(server.port)
    with Client(f"http://127.0.0.1:{port}") as c:
        r = c.append([ev("py-append", "a", i) for i in range(3)])
        assert lost == [1]
        assert [e["duplicate"] for e in r["events"]] == [True] * 3
        page = c.events(0, stream="py-append")
        assert [e["seq"] for e in page["events"]] == [e["seq"] for e in r["events"]]
        with pytest.raises(ApiError) as bad:
            c.append([{"stream": "py-append", "subject": "a", "type": "", "payload": {}}])
        assert bad.value.status == 400 and bad.value.code == "invalid_field"


def test_an_append_waits_out_a_429(make_server):
    token = secrets.token_hex(16)
    s = make_server(
        '[[auth.tokens]]\nname = "limited"\nsha256 = "%s"\nscopes = ["admin"]\nrate = "60/m"\n'
        % hashlib.sha256(token.encode()).hexdigest())
    refused = False
    for _ in range(200):
        r = httpx.get(s.base + "/v1/events?after_sequence=0",
                      headers={"authorization": f"Bearer {token}"})
        if r.status_code == 429:
            assert "retry-after" in r.headers
            refused = True
            break
    assert refused
    with Client(s.base, token) as c:
        r = c.append([ev("py-rate", "a", 0)])
        assert r["events"][0]["duplicate"] is False


def test_a_stream_resumes_across_a_kill_9_with_each_seq_once_in_order(server):
    c = Client(server.base)
    c.append([ev("py-stream", "a", i) for i in range(40)])
    stop = threading.Event()
    seen: list[int] = []
    it = c.stream(0, stream="py-stream", stop=stop)
    for e in it:
        seen.append(e["seq"])
        if len(seen) == 40:
            break
    server.kill9()
    server.restart()
    for i in range(40, 60):
        c.append([ev("py-stream", "a", i)])
    for e in it:
        assert e["payload"]["i"] == len(seen)
        seen.append(e["seq"])
        if len(seen) == 60:
            break
    log = [e["seq"] for e in c.events(0, stream="py-stream", limit=1000)["events"]]
    assert seen == log
    stop.set()
    c.close()


def test_the_asyncio_client_streams_across_a_kill_9(server):
    async def main() -> list[int]:
        async with AsyncClient(server.base) as c:
            await c.append([ev("py-async", "a", i) for i in range(10)])
            seen: list[int] = []
            gen = c.stream(0, stream="py-async")
            async for e in gen:
                seen.append(e["seq"])
                if len(seen) == 10:
                    break
            await gen.aclose()
            server.kill9()
            server.restart()
            await c.append([ev("py-async", "a", i) for i in range(10, 15)])
            gen = c.stream(seen[-1], stream="py-async")
            async for e in gen:
                seen.append(e["seq"])
                if len(seen) == 15:
                    break
            await gen.aclose()
            log = [e["seq"] for e in (await c.events(0, stream="py-async"))["events"]]
            assert seen == log
            return seen

    assert len(asyncio.run(main())) == 15


class Crash(Exception):
    pass


def test_a_consumer_resumes_from_its_cursor_after_a_crash_and_a_server_kill(server):
    c = Client(server.base)
    for chunk in range(6):
        c.append([ev("py-consumer", "b", chunk * 20 + i) for i in range(20)])
    handled: list[int] = []
    pages = [0]

    def handler(page: list) -> None:
        handled.extend(e["payload"]["i"] for e in page)
        pages[0] += 1
        if pages[0] in (2, 5):
            # Handled, then the process dies before the advance.
            raise Crash()

    for _ in range(2):
        with pytest.raises(Crash):
            c.consumer("py-bridge", "py-consumer", page=9).run(handler)
    stop = threading.Event()
    t = threading.Thread(target=lambda: c.consumer("py-bridge", "py-consumer", page=9)
                         .run(lambda p: (time.sleep(0.01), handler(p)), stop), daemon=True)
    t.start()
    time.sleep(0.05)
    server.kill9()
    server.restart()
    deadline = time.time() + 60
    while len(set(handled)) < 120 and time.time() < deadline:
        time.sleep(0.05)
    stop.set()
    t.join(10)
    top = -1
    repeats = 0
    for i in handled:
        if i <= top:
            repeats += 1
        else:
            assert i == top + 1, f"skipped after {top}: {handled}"
            top = i
    assert top == 119
    assert repeats <= 3 * 9
    last = c.events(0, stream="py-consumer", limit=1000)["events"][-1]["seq"]
    assert c.cursor("py-bridge", "py-consumer")["last_sequence"] == last


def urgent(id_: str) -> dict:
    return {"event_id": id_, "stream": "notifications", "subject": id_,
            "type": "notification.requested",
            "payload": {"priority": "urgent", "title": f"title of {id_}"}}


def wait_delivery(c: Client, id_: str) -> dict:
    deadline = time.time() + 30
    while True:
        try:
            return c.delivery(id_)
        except ApiError as e:
            if e.status != 404 or time.time() > deadline:
                raise
            time.sleep(0.05)


def test_a_worker_extends_completes_fails_and_lets_go_on_shutdown(server):
    c = Client(server.base)
    c.append([urgent("pw-slow"), urgent("pw-bad")])
    for i in ("pw-slow", "pw-bad"):
        wait_delivery(c, f"dlv:{i}:desktop")
    stop = threading.Event()
    seen: list[str] = []

    def handler(d: dict):
        seen.append(d["id"])
        if len(seen) == 2:
            stop.set()
        if d["notification_id"] == "pw-bad":
            return Failed("receiver_refused", "the desktop refused it", retryable=False)
        time.sleep(2.4)  # four leases long: only the heartbeat keeps it
        return Done()

    report = c.worker("app", "py-desk", lease_ms=600).run(handler, stop)
    assert report["refused"] == 0, report
    assert report["completed"] + report["failed"] == 2, report
    assert c.delivery("dlv:pw-slow:desktop")["status"] == "sent"
    bad = c.delivery("dlv:pw-bad:desktop")
    assert bad["status"] == "parked" and "receiver_refused" in str(bad)

    c.append([urgent(f"pw-{i}") for i in range(5)])
    for i in range(5):
        wait_delivery(c, f"dlv:pw-{i}:desktop")
    stop = threading.Event()

    def first_stops(d: dict):
        stop.set()
        return Done()

    report = c.worker("app", "py-desk-2", limit=5).run(first_stops, stop)
    assert (report["completed"], report["released"]) == (1, 4), report
    assert len(c.claim("app", "py-desk-3", 10)) == 4


def test_tidemarks_webhook_posts_verify_under_both_keys_during_a_rotation(server):
    hits: list = []

    class Hook(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            body = self.rfile.read(int(self.headers["content-length"]))
            hits.append((dict(self.headers), body))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *a):
            pass

    hook = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    old, new = secrets.token_hex(16), secrets.token_hex(16)

    def put(secret: str) -> None:
        r = httpx.put(server.base + "/v1/routes/pyhook", json={
            "route": {"sink": "webhook", "url": f"http://127.0.0.1:{hook.server_port}/hook",
                      "secret": secret, "rotation_overlap": "1h", "priorities": ["urgent"]},
            "reason": "the Python client's verification test"})
        assert r.status_code == 200, r.text

    def posted(id_: str):
        deadline = time.time() + 30
        while time.time() < deadline:
            for h, b in hits:
                if {k.lower(): v for k, v in h.items()}.get("webhook-id") == id_:
                    return h, b
            time.sleep(0.05)
        raise AssertionError(f"no POST of {id_}")

    c = Client(server.base)
    put(old)
    c.append([urgent("pv-1")])
    h, body = posted("dlv:pv-1:pyhook")
    verify_webhook(old, h, body)
    with pytest.raises(WebhookVerificationError):
        verify_webhook(new, h, body)
    with pytest.raises(WebhookVerificationError):
        verify_webhook(old, h, body + b" ")
    put(new)
    c.append([urgent("pv-2")])
    h, body = posted("dlv:pv-2:pyhook")
    verify_webhook(new, h, body)
    verify_webhook(old, h, body)
    verify_webhook([secrets.token_hex(8), new], h, body)
    hook.shutdown()


def test_every_operation_is_a_call_with_typed_problems(server):
    c = Client(server.base)
    assert c.ops.get_whoami()["open"] is True
    put = c.ops.put_route("py-ops", {"route": {"sink": "app", "priorities": ["urgent"]},
                                     "reason": "the generated calls"})
    assert put["name"] == "py-ops"
    assert c.ops.get_route("py-ops")["route"]["sink"] == "app"
    with pytest.raises(ApiError) as missing:
        c.ops.get_delivery("dlv:none:desktop")
    assert missing.value.status == 404 and missing.value.code
    with pytest.raises(TypeError):
        c.ops.list_routes(no_such=1)

    async def main():
        async with AsyncClient(server.base) as a:
            return (await a.ops.get_route("py-ops"))["route"]["sink"]

    assert asyncio.run(main()) == "app"


def conforms(value, tp, where="answer"):
    """Whether ``value`` is of type ``tp`` (a model of :mod:`tidemark_client.models`, or the
    ``typing`` forms they use): a TypedDict's required keys are there and every key it names
    holds its type."""
    origin = typing.get_origin(tp)
    if tp is typing.Any:
        return
    if origin is typing.Union:
        args = typing.get_args(tp)
        if value is None:
            assert type(None) in args, f"{where}: null"
            return
        return conforms(value, next(a for a in args if a is not type(None)), where)
    if origin in (list, typing.List):
        assert isinstance(value, list), f"{where}: {value!r} is not a list"
        for i, v in enumerate(value):
            conforms(v, typing.get_args(tp)[0], f"{where}[{i}]")
        return
    if origin in (dict, typing.Dict):
        assert isinstance(value, dict), f"{where}: {value!r} is not an object"
        return
    if isinstance(tp, type) and issubclass(tp, dict) and hasattr(tp, "__required_keys__"):
        assert isinstance(value, dict), f"{where}: {value!r} is not an object"
        missing = tp.__required_keys__ - value.keys()
        assert not missing, f"{where}: {tp.__name__} lacks {sorted(missing)}"
        hints = typing.get_type_hints(tp)
        for k, v in value.items():
            if k in hints:
                conforms(v, hints[k], f"{where}.{k}")
        return
    if tp is float:
        assert isinstance(value, (int, float)) and not isinstance(value, bool), f"{where}: {value!r}"
        return
    assert isinstance(value, tp) and not (tp is int and isinstance(value, bool)), \
        f"{where}: {value!r} is not {tp.__name__}"


def test_the_calls_answer_the_documents_models(server):
    # Every call's annotations resolve to the generated models, in both classes.
    for cls in (Ops, AsyncOps):
        for name, fn in vars(cls).items():
            if not name.startswith("_"):
                typing.get_type_hints(fn)
    c = Client(server.base)
    task = "py-typed"
    c.append([
        {"stream": "task_events", "subject": task, "type": "task.created",
         "payload": {"project_id": "py"}},
        {"event_id": "py-typed-n", "stream": "notifications", "subject": "py-typed-n",
         "type": "notification.requested",
         "payload": {"priority": "urgent", "title": "typed", "task_id": task,
                     "type": "build.done", "type_data": {"n": 1}}},
    ])
    dlv = "dlv:py-typed-n:desktop"
    deadline = time.monotonic() + 30
    while True:
        try:
            c.ops.get_delivery(dlv)
            break
        except ApiError:
            assert time.monotonic() < deadline, "no delivery"
            time.sleep(0.05)
    claimed = c.ops.claim_deliveries({"sink": "app", "owner": "py", "limit": 5})
    conforms(claimed, models.DeliveriesPage, "claim")
    conforms(c.ops.complete_delivery(dlv, {"owner": "py"}), models.DeliveryOut, "complete")
    for call, tp in [
        (lambda: c.ops.get_delivery(dlv), models.DeliveryAnswer),
        (lambda: c.ops.list_deliveries(sink="app"), models.DeliveriesPage),
        (lambda: c.ops.get_task(task), models.TaskAnswer),
        (lambda: c.ops.list_tasks(), models.TasksPage),
        (lambda: c.ops.get_notification_status("py-typed-n"), models.NotificationStatusOut),
        (lambda: c.ops.list_notifications(), models.NotificationsPage),
        (lambda: c.ops.list_events(), models.EventsPage),
        (lambda: c.ops.list_routes(), models.RoutesPage),
        (lambda: c.ops.list_projections(), models.ProjectionsPage),
        (lambda: c.ops.get_outbox_kpis(), models.KpisOut),
        (lambda: c.ops.get_sink_health(), models.SinksOut),
        (lambda: c.ops.get_whoami(), models.Identity),
        (lambda: c.ops.get_health(), models.Health),
    ]:
        conforms(call(), tp, tp.__name__)
    # The checker itself refuses what does not conform.
    with pytest.raises(AssertionError):
        conforms({"open": "yes"}, models.Identity)
    with pytest.raises(AssertionError):
        conforms({}, models.DeliveryOut)


def test_a_worker_survives_a_kill_9_of_the_server_and_every_delivery_is_sent(server):
    c = Client(server.base)
    ids = [f"pk-{i}" for i in range(20)]
    c.append([urgent(i) for i in ids])
    for i in ids:
        wait_delivery(c, f"dlv:{i}:desktop")
    handled: list[str] = []
    stop = threading.Event()

    def handler(d: dict):
        time.sleep(0.03)
        handled.append(d["notification_id"])
        return Done()

    result: dict = {}
    t = threading.Thread(target=lambda: result.update(
        c.worker("app", "py-kill", limit=5, lease_ms=2000).run(handler, stop)), daemon=True)
    t.start()
    deadline = time.time() + 60
    while len(handled) < 6 and time.time() < deadline:
        time.sleep(0.01)
    server.kill9()
    server.restart()
    deadline = time.time() + 120
    while time.time() < deadline:
        if all(c.delivery(f"dlv:{i}:desktop")["status"] == "sent" for i in ids):
            break
        time.sleep(0.1)
    stop.set()
    t.join(30)
    assert set(handled) == set(ids), handled
    assert len(handled) - len(set(handled)) <= 5, handled
    assert result["completed"] + result["refused"] == len(handled), result


def test_a_tenants_client_reads_and_writes_that_tenant_alone(make_server):
    op_token, beta_token = secrets.token_hex(16), secrets.token_hex(16)
    tok = lambda name, text, tenant: (  # noqa: E731
        '[[auth.tokens]]\nname = "%s"\nsha256 = "%s"\nscopes = ["admin"]\ntenant = "%s"\n\n'
        % (name, hashlib.sha256(text.encode()).hexdigest(), tenant))
    s = make_server(tok("op", op_token, "*") + tok("beta", beta_token, "beta"))
    with Client(s.base, op_token) as op:
        for name in ("acme", "beta"):
            op.ops.create_tenant({"name": name, "reason": "py test"})
        acme = op.tenant("acme")
        with pytest.raises(ValueError):
            op.tenant("Not A Tenant")
        batch = [dict(ev("py-tenant", "a", i), event_id=f"e-{i}") for i in range(2)]
        r = acme.append(batch)
        seqs = [e["seq"] for e in r["events"]]
        # The same event ids in the default tenant are its own, not acme's duplicates.
        r = op.append(batch)
        assert [e["duplicate"] for e in r["events"]] == [False, False]
        assert acme.append(batch)["events"][0]["duplicate"] is True
        page = acme.events(0, stream="py-tenant")
        assert [e["seq"] for e in page["events"]] == seqs
        assert [e["tenant"] for e in page["events"]] == ["acme", "acme"]
        stop = threading.Event()
        seen = []
        for e in acme.stream(0, stream="py-tenant", stop=stop):
            seen.append(e["seq"])
            if len(seen) == 2:
                stop.set()
                break
        assert seen == seqs
        acme.close()
    # A tenant's own token acts for it; with another tenant's prefix it is refused.
    with Client(s.base, beta_token) as beta:
        assert beta.events(0, stream="py-tenant")["events"] == []
        with pytest.raises(ApiError) as refused:
            beta.tenant("acme").events(0)
        assert refused.value.status == 403 and refused.value.code == "tenant_forbidden"


def test_the_asyncio_client_acts_for_a_tenant(make_server):
    s = make_server()

    async def run() -> None:
        async with AsyncClient(s.base) as c:
            await c.ops.create_tenant({"name": "acme", "reason": "py test"})
            acme = c.tenant("acme")
            await acme.append([ev("py-atenant", "a", 0)])
            page = await acme.events(0, stream="py-atenant")
            assert [e["tenant"] for e in page["events"]] == ["acme"]
            assert (await c.events(0, stream="py-atenant"))["events"] == []
            await acme.aclose()

    asyncio.run(run())
