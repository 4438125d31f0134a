#!/usr/bin/env bash
# The Debian package end to end (spec section 18), run by .ci/run as root: build it, install it
# with dpkg -i, check what it installed (binary, unit, config, user, directories), start the
# binary the way the unit does (as its User=, with its ExecStart=: the packaged config), append
# an event and read the probes, take a backup, stop it with SIGTERM, restore the backup as
# docs/operations.md walks it (--owner tidemark, the directories swapped), start it again on the
# restored log and verify its models, then remove and purge the package.
set -euo pipefail
cd "$(dirname "$0")/../.."
fail() { echo "test-package: $*" >&2; exit 1; }
[[ $(id -u) -eq 0 ]] || fail "needs root (dpkg -i)"
if dpkg -s tidemark >/dev/null 2>&1; then fail "a tidemark package is already installed here"; fi
# Its cleanup deletes these: never on a machine where they hold something of someone else's.
for there in /var/lib/tidemark /var/lib/tidemark.restored /var/lib/tidemark.before-restore \
  /var/backups/tidemark /etc/tidemark; do
  [[ ! -e $there ]] || fail "$there exists: not a clean machine for this test"
done
if getent passwd tidemark >/dev/null; then fail "a tidemark user exists: not a clean machine"; fi
cargo build --release -p tidemark-api --bin tidemark
deb=$(bash deploy/debian/build.sh)
echo "test-package: built $deb ($(du -h "$deb" | cut -f1))"
# Read whole before matching: grep -q leaves at the first match, and under pipefail the SIGPIPE
# dpkg-deb gets then failed this check about one run in six.
info=$(dpkg-deb --info "$deb") || fail "dpkg-deb --info $deb failed"
[[ $info == *"Package: tidemark"* ]] || fail "no control file"
cleanup() {
  [[ -n ${pid:-} ]] && kill "$pid" 2>/dev/null || true
  dpkg -P tidemark >/dev/null 2>&1 || true
  rm -rf /var/lib/tidemark /var/lib/tidemark.restored /var/lib/tidemark.before-restore \
    /var/backups/tidemark /usr/sbin/policy-rc.d.tidemark-test
  [[ -e /usr/sbin/policy-rc.d.saved ]] && mv /usr/sbin/policy-rc.d.saved /usr/sbin/policy-rc.d
  [[ -e /usr/sbin/policy-rc.d.ours ]] && rm -f /usr/sbin/policy-rc.d /usr/sbin/policy-rc.d.ours
  userdel tidemark 2>/dev/null || true
  groupdel tidemark 2>/dev/null || true
}
trap cleanup EXIT
# Where systemd runs, postinst would start the real unit (which locks the log this test's own
# server needs): invoke-rc.d's policy says no while the test runs.
if [[ -d /run/systemd/system ]]; then
  [[ -e /usr/sbin/policy-rc.d ]] && mv /usr/sbin/policy-rc.d /usr/sbin/policy-rc.d.saved
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
  chmod 755 /usr/sbin/policy-rc.d
  touch /usr/sbin/policy-rc.d.ours
fi
dpkg -i "$deb"
for f in /usr/bin/tidemark /lib/systemd/system/tidemark.service /etc/tidemark/tidemark.toml \
         /usr/share/doc/tidemark/configuration.md; do
  [[ -e $f ]] || fail "$f was not installed"
done
getent passwd tidemark >/dev/null || fail "no tidemark user"
# `config show` reads the file the unit gives the server, without being told.
shown=$(cd / && env -u TIDEMARK_CONFIG /usr/bin/tidemark config show 2>&1) || fail "config show: $shown"
[[ $shown == *"# /etc/tidemark/tidemark.toml"* && $shown == *'backup_dir = "/var/backups/tidemark"'* ]] \
  || fail "config show did not read the packaged config: $shown"
[[ $(stat -c %U /var/lib/tidemark) == tidemark ]] || fail "/var/lib/tidemark is not the tidemark user's"
[[ $(stat -c %a /var/lib/tidemark) == 750 ]] || fail "/var/lib/tidemark is not 0750"
# The unit's user and command, run as it runs them; port 0 so no other test's port is taken.
unit=/lib/systemd/system/tidemark.service
user=$(sed -n 's/^User=//p' "$unit")
exec_start=$(sed -n 's/^ExecStart=//p' "$unit")
[[ $user == tidemark && -n $exec_start ]] || fail "the unit names no User= or ExecStart="
out=$(mktemp)
start_service() {
  : >"$out"
  cd /var/lib/tidemark
  # setpriv execs the command as the user (no process in between, as systemd does), so the PID
  # is the server's and SIGTERM reaches it.
  # shellcheck disable=SC2086
  TIDEMARK_SERVER__LISTEN=127.0.0.1:0 RUST_LOG=info \
    setpriv --reuid="$user" --regid="$user" --init-groups -- $exec_start >"$out" 2>"$out.err" &
  pid=$!
  cd - >/dev/null
  for _ in $(seq 1 600); do
    grep -q "^listening on" "$out" && break
    kill -0 "$pid" 2>/dev/null || { cat "$out.err" >&2; fail "the service exited at start"; }
    sleep 0.1
  done
  addr=$(sed -n 's/^listening on http:\/\///p' "$out")
  [[ -n $addr ]] || { cat "$out.err" >&2; fail "the service never said where it listens"; }
}
stop_service() {
  kill -TERM "$pid"
  wait "$pid" || fail "the service did not stop cleanly on SIGTERM"
  pid=
  grep -q "stopped cleanly" "$out.err" || fail "no clean stop in the log"
}
start_service
for probe in livez readyz healthz; do
  code=$(curl -s -o /dev/null -w '%{http_code}' "http://$addr/$probe")
  [[ $code == 200 ]] || fail "/$probe answered $code"
done
receipt=$(echo '{"event_id":"pkg-1","stream":"package","subject":"ci","type":"package.installed","payload":{"ok":true}}' \
  | /usr/bin/tidemark append --url "$addr" -o json)
[[ $receipt == *'"event_id":"pkg-1"'* ]] || fail "append answered $receipt"
[[ -f /var/lib/tidemark/log.redb && $(stat -c %U /var/lib/tidemark/log.redb) == tidemark ]] \
  || fail "the log is not in /var/lib/tidemark, owned by tidemark"
# A backup, then the restore docs/operations.md walks for the package, step by step, as root.
/usr/bin/tidemark backup --url "$addr" --to /var/backups/tidemark/pkg-nightly -o json >/dev/null \
  || fail "the backup streamed from the service failed"
[[ -f /var/backups/tidemark/pkg-nightly/manifest.json ]] || fail "no backup in /var/backups/tidemark"
stop_service
/usr/bin/tidemark restore --from /var/backups/tidemark/pkg-nightly \
  --data /var/lib/tidemark.restored --owner tidemark -o json >/dev/null || fail "the restore failed"
mv /var/lib/tidemark /var/lib/tidemark.before-restore
mv /var/lib/tidemark.restored /var/lib/tidemark
chmod 0750 /var/lib/tidemark
[[ $(stat -c %U:%a /var/lib/tidemark/log.redb) == tidemark:600 ]] \
  || fail "the restored log is $(stat -c %U:%a /var/lib/tidemark/log.redb), not tidemark:600"
start_service
events=$(curl -sf "http://$addr/v1/events?stream=package&limit=10") || fail "reading the restored log"
[[ $events == *'"event_id":"pkg-1"'* ]] || fail "the restored log lacks pkg-1: $events"
/usr/bin/tidemark projections verify --url "$addr" >/dev/null || fail "the restored models do not verify"
stop_service
rm -rf /var/lib/tidemark.before-restore
dpkg -r tidemark
[[ ! -e /usr/bin/tidemark ]] || fail "dpkg -r left /usr/bin/tidemark"
[[ -e /etc/tidemark/tidemark.toml ]] || fail "dpkg -r removed the conffile (only purge does)"
dpkg -P tidemark
[[ ! -e /etc/tidemark/tidemark.toml ]] || fail "purge left the config"
[[ -e /var/lib/tidemark/log.redb ]] || fail "purge deleted the event log (it is kept)"
rm -f "$out" "$out.err"
trap - EXIT
cleanup
echo "test-package: installed, served as the unit does, appended, backed up, restored as documented, removed: ok"
