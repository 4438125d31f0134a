"""Longest gap between completed appends of one keep-alive client (1 x 1) while an operation
runs on the server: python3 pause.py PORT OP SECONDS. OP: none | backup | rebuild | preload N"""
import http.client, json, sys, threading, time, uuid
port = int(sys.argv[1]); op = sys.argv[2]
def conn(): return http.client.HTTPConnection("127.0.0.1", port, timeout=120)
def post(c, path, body):
    c.request("POST", path, body=json.dumps(body), headers={"content-type": "application/json"})
    r = c.getresponse(); data = r.read(); return r.status, data
def ev(i):
    return {"event_id": f"p-{uuid.uuid4().hex}", "stream": "task_events", "subject": f"t{i % 1000}",
            "type": "bench.tick", "payload": {"i": i, "pad": "x" * 200}}
if op == "preload":
    n = int(sys.argv[3]); c = conn(); t = time.time()
    for b in range(n // 1000):
        s, d = post(c, "/v1/events", {"events": [ev(b * 1000 + i) for i in range(1000)]})
        assert s in (200, 201), (s, d[:300])
    print(f"preloaded {n} in {time.time() - t:.1f} s"); sys.exit()
secs = float(sys.argv[3])
stop = False; stamps = []
def load():
    c = conn(); i = 0
    while not stop:
        s, d = post(c, "/v1/events", {"events": [ev(i)]}); i += 1
        assert s in (200, 201), (s, d[:300])
        stamps.append(time.perf_counter())
th = threading.Thread(target=load); th.start()
time.sleep(1.0)
t0 = time.perf_counter(); result = None
if op == "backup":
    s, d = post(conn(), "/v1/admin/backup", {"to": f"b-{uuid.uuid4().hex[:8]}"}); result = (s, d[:200])
elif op == "retention":
    s, d = post(conn(), "/v1/admin/retention/run", {}); result = (s, d[:300])
elif op == "rebuild":
    s, d = post(conn(), f"/v1/admin/projections/{sys.argv[4]}/rebuild", {}); result = (s, d[:200])
else:
    time.sleep(secs)
t1 = time.perf_counter()
time.sleep(0.5); stop = True; th.join()
inside = [t for t in stamps if t0 <= t <= t1 + 0.5]
gaps = sorted((b - a for a, b in zip(inside, inside[1:])), reverse=True)
print(json.dumps({"op": op, "op_seconds": round(t1 - t0, 3), "appends_during": len(inside),
                  "longest_gap_ms": round(gaps[0] * 1000, 1) if gaps else None,
                  "top5_ms": [round(g * 1000, 1) for g in gaps[:5]], "result": str(result)}))
