"""schemathesis hooks for tidemark's API fuzz run (tests/api-fuzz/run.sh).

Two answers depend on the log's state rather than on the request's shape, so a schema cannot
describe them and the fuzzer would count them as failures:

* `min_seq` past the log head: the read waits the documented 5 s for a seq this server has
  not assigned, then answers the documented `503 projection_lagging` (tested on its own in
  tests/tests/e2e/e2e_read_models.rs). Each such case would also cost the run 5 s.
* a cursor's `last_sequence` / `expected_sequence` past the log head: `422` (a cursor cannot
  point at an event that does not exist; tested in e2e_bridges.rs).

So before each call, integer values of those fields above the current head are lowered to the
head (read from /healthz). Every other value, valid or not, goes out as generated.
"""

import json
import os
import time
import urllib.request

import schemathesis

BASE = os.environ.get("TIDEMARK_FUZZ_BASE", "http://127.0.0.1:7790")
_head = {"at": 0.0, "value": 0}


def head():
    now = time.monotonic()
    if now - _head["at"] > 0.2:
        with urllib.request.urlopen(f"{BASE}/healthz", timeout=5) as r:
            _head["value"] = json.load(r)["head"]
        _head["at"] = now
    return _head["value"]


def _lower(container, key):
    v = container.get(key) if isinstance(container, dict) else None
    if isinstance(v, bool):
        return
    if isinstance(v, float) and v.is_integer() and v > head():
        container[key] = float(head())
    elif isinstance(v, int) and v > head():
        container[key] = head()
    elif isinstance(v, str) and v.isdigit() and int(v) > head():
        container[key] = str(head())


@schemathesis.hook
def before_call(ctx, case, **kwargs):
    if isinstance(case.query, dict):
        _lower(case.query, "min_seq")
    if case.path in ("/v1/cursors/advance", "/v1/cursors/reset") and isinstance(case.body, dict):
        _lower(case.body, "last_sequence")
        _lower(case.body, "expected_sequence")
