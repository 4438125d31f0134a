#!/usr/bin/env bash
# emails/s from a local SMTP server (aiosmtpd) with N in flight: 500 notifications, each one
# email; the time from the first append until the server has all 500 messages.
set -euo pipefail
N=${1:?concurrency}
BIN=${2:-/work/main/target/release/tidemark}
W=$(mktemp -d)
# Usage: tests/smtp/throughput.sh N [BIN]  (BIN: a release build of tidemark)
python3 /work/main/tests/smtp/server.py $W/smtp $$ & mkdir -p $W/smtp
while [ ! -f $W/smtp/port ]; do sleep 0.1; done
P=$(cat $W/smtp/port)
cat > $W/c.toml <<TOML
[notifications.routing]
urgent = ["dashboard", "email"]
[notifications.routes.email]
sink = "email"
[sinks.email]
url = "smtp://127.0.0.1:$P"
from = "tidemark <noreply@example.org>"
timeout = "10s"
concurrency = $N
TOML
$BIN serve --data $W/data --listen 127.0.0.1:0 --config $W/c.toml > $W/out.log 2>$W/err.log &
TP=$!
while ! grep -q listening $W/out.log; do sleep 0.1; done
URL=$(grep -o 'http://[0-9.:]*' $W/out.log | head -1)
start=$(date +%s.%N)
for b in 0 1 2 3 4; do
  python3 - "$URL" $b <<'PY'
import json, sys, urllib.request
url, b = sys.argv[1], int(sys.argv[2])
evs = [{"event_id": f"e{b}-{i}", "stream": "notifications", "subject": f"e{b}-{i}", "type": "notification.requested",
        "payload": {"priority": "urgent", "title": f"t {i}", "recipient": f"u{b}-{i}@example.org"}} for i in range(100)]
req = urllib.request.Request(url + "/v1/events", data=json.dumps({"events": evs}).encode(), headers={"content-type": "application/json"})
urllib.request.urlopen(req).read()
PY
done
while [ "$(wc -l < $W/smtp/messages.jsonl 2>/dev/null || echo 0)" -lt 500 ]; do sleep 0.05; done
end=$(date +%s.%N)
python3 -c "import sys; d=$end-$start; print(f'concurrency $N: 500 emails in {d:.2f} s = {500/d:.0f} emails/s')"
kill $TP; kill $(cat $W/smtp/pid) 2>/dev/null || true
