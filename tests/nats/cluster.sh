#!/usr/bin/env bash
# A three-node NATS JetStream cluster on loopback, for the tests (spec section 16).
#
#   cluster.sh start DIR [OWNER_PID]   start it under DIR; print the client URLs, comma-separated
#   cluster.sh stop DIR                stop every server by the PID it recorded
#   cluster.sh kill DIR N              kill -9 server N (1..3)
#   cluster.sh restart DIR N           start server N again on its own store and ports
#
# Ports are chosen free; each server runs with `sync_interval: always` (an acknowledged write
# survives power loss). With OWNER_PID, a watchdog stops the cluster once that process is gone,
# so a test binary that exits (or crashes) never leaves servers behind.
set -euo pipefail
cmd=${1:?start|stop|kill|restart}
dir=${2:?DIR}
mkdir -p "$dir"

free_ports() {
  python3 - "$1" <<'PY'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
for s in socks: s.close()
PY
}

start_one() {
  local n=$1
  nats-server -c "$dir/n$n.conf" >"$dir/n$n.log" 2>&1 &
  echo $! >"$dir/n$n.pid"
}

case "$cmd" in
start)
  command -v nats-server >/dev/null 2>&1 ||
    { echo "cluster.sh: nats-server is not on PATH (benches/peers/install.sh installs it)" >&2; exit 1; }
  # 2.15.0 is the first release whose replicated streams sync once per Raft append under
  # `sync_interval: always` (nats-server PR #8447) while acknowledging only what a quorum
  # synced: the tests and the figures of docs/scale.md are of that server.
  version=$(nats-server --version | sed -E 's/^[^0-9]*([0-9]+)\.([0-9]+)\.([0-9]+).*/\1 \2 \3/')
  read -r major minor _ <<<"$version"
  if ((major < 2 || (major == 2 && minor < 15))); then
    echo "cluster.sh: nats-server $(nats-server --version) is older than 2.15.0 (benches/peers/install.sh installs 2.15.1)" >&2
    exit 1
  fi
  read -r -a ports <<<"$(free_ports 9)"
  routes=""
  for n in 1 2 3; do
    routes+="nats-route://127.0.0.1:${ports[$((n * 3 - 2))]},"
  done
  urls=()
  for n in 1 2 3; do
    client=${ports[$((n * 3 - 3))]} cluster=${ports[$((n * 3 - 2))]} http=${ports[$((n * 3 - 1))]}
    mkdir -p "$dir/store$n"
    cat >"$dir/n$n.conf" <<CONF
server_name: n$n
listen: 127.0.0.1:$client
http: 127.0.0.1:$http
max_payload: 8MB
jetstream {
  store_dir: "$dir/store$n"
  sync_interval: always
}
cluster {
  name: tidemark-test
  listen: 127.0.0.1:$cluster
  routes: [${routes%,}]
}
CONF
    echo "$http" >"$dir/n$n.http"
    urls+=("nats://127.0.0.1:$client")
    start_one "$n"
  done
  (IFS=,; echo "${urls[*]}") >"$dir/urls"
  # Ready when every server answers its health check with JetStream up (a meta leader).
  for _ in $(seq 1 300); do
    ok=0
    for n in 1 2 3; do
      if curl -fsS "http://127.0.0.1:$(cat "$dir/n$n.http")/healthz?js-enabled-only=true" >/dev/null 2>&1 &&
         curl -fsS "http://127.0.0.1:$(cat "$dir/n$n.http")/jsz" 2>/dev/null | grep -Eq '"leader": ?"n[0-9]"' ; then
        ok=$((ok + 1))
      fi
    done
    [[ $ok -eq 3 ]] && break
    sleep 0.1
  done
  if [[ $ok -ne 3 ]]; then
    echo "cluster.sh: the cluster under $dir was not ready in 30 s (see $dir/n*.log)" >&2
    for n in 1 2 3; do kill -9 "$(cat "$dir/n$n.pid")" 2>/dev/null || true; done
    exit 1
  fi
  if [[ -n "${3:-}" ]]; then
    owner=$3
    (
      trap '' HUP
      while kill -0 "$owner" 2>/dev/null; do sleep 1; done
      for n in 1 2 3; do kill -9 "$(cat "$dir/n$n.pid")" 2>/dev/null || true; done
    ) </dev/null >/dev/null 2>&1 &
  fi
  cat "$dir/urls"
  ;;
stop)
  for n in 1 2 3; do
    [[ -f "$dir/n$n.pid" ]] && kill -9 "$(cat "$dir/n$n.pid")" 2>/dev/null || true
  done
  ;;
kill)
  kill -9 "$(cat "$dir/n${3:?N}.pid")"
  ;;
restart)
  start_one "${3:?N}"
  ;;
*)
  echo "unknown command $cmd" >&2
  exit 2
  ;;
esac
