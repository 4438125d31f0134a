#!/usr/bin/env bash
# Build the Debian package: target/debian/tidemark_<version>_<arch>.deb from the release binary
# (`cargo build --release -p tidemark-api --bin tidemark` first). Contents: /usr/bin/tidemark,
# the systemd unit, /etc/tidemark/tidemark.toml (every built-in setting, commented, from
# api/src/defaults.toml; the data and backup directories set for the package), the docs, and
# the maintainer scripts of this directory (its own user, /var/lib/tidemark).
set -euo pipefail
cd "$(dirname "$0")/../.."
version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)
arch=$(dpkg --print-architecture)
bin=target/release/tidemark
[[ -x $bin ]] || { echo "build.sh: $bin is missing: cargo build --release -p tidemark-api --bin tidemark" >&2; exit 1; }
stage=target/debian/stage
rm -rf "$stage"
mkdir -p "$stage/DEBIAN"
install -D -m 0755 "$bin" "$stage/usr/bin/tidemark"
# The release profile keeps debug info for profiling; the package ships without it.
strip --strip-debug "$stage/usr/bin/tidemark"
install -D -m 0644 deploy/debian/tidemark.service "$stage/lib/systemd/system/tidemark.service"
install -d "$stage/etc/tidemark"
bash deploy/debian/config.sh > "$stage/etc/tidemark/tidemark.toml"
for doc in README.md CHANGELOG.md docs/operations.md docs/configuration.md docs/upgrading.md; do
  install -D -m 0644 "$doc" "$stage/usr/share/doc/tidemark/$(basename "$doc")"
done
# The copyright file (machine-readable format 1.0) carries both licenses' texts, taken from the
# repository's LICENSE-MIT and LICENSE-APACHE so the package cannot say otherwise than the
# source: each line indented by one space, an empty line written " .".
license_text() { sed -e '/./,$!d' -e 's/[[:space:]]*$//' -e 's/^$/./' -e 's/^/ /' "$1"; }
holder=$(sed -n 's/^Copyright (c) //p' LICENSE-MIT)
[[ -n $holder ]] || { echo "build.sh: LICENSE-MIT names no copyright holder" >&2; exit 1; }
{
  cat <<COPY
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: tidemark
Upstream-Contact: tidemark developers <dev@tidemark.invalid>

Files: *
Copyright: $holder
License: MIT or Apache-2.0

License: MIT
COPY
  license_text LICENSE-MIT
  echo
  echo "License: Apache-2.0"
  license_text LICENSE-APACHE
} > "$stage/usr/share/doc/tidemark/copyright"
for s in postinst prerm postrm; do install -m 0755 "deploy/debian/$s" "$stage/DEBIAN/$s"; done
echo /etc/tidemark/tidemark.toml > "$stage/DEBIAN/conffiles"
size=$(du -sk --exclude=DEBIAN "$stage" | cut -f1)
cat > "$stage/DEBIAN/control" <<CONTROL
Package: tidemark
Version: $version
Architecture: $arch
Maintainer: tidemark developers <dev@tidemark.invalid>
Installed-Size: $size
Depends: adduser, libc6 (>= 2.34)
Section: net
Priority: optional
Homepage: https://tidemark.dev
Description: event-sourced notification and delivery engine
 Every lifecycle, notification and delivery fact is appended to one durable log; read models
 are folds over it; clients resume live streams over HTTP and Server-Sent Events. Runs as the
 systemd service tidemark.service, user tidemark, data in /var/lib/tidemark, configuration in
 /etc/tidemark/tidemark.toml.
CONTROL
out="target/debian/tidemark_${version}_${arch}.deb"
dpkg-deb --root-owner-group -Zgzip --build "$stage" "$out" >/dev/null
echo "$out"
