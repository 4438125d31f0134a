#!/usr/bin/env bash
# The packaged /etc/tidemark/tidemark.toml on stdout: api/src/defaults.toml with every setting
# commented out (the server has them built in) except the package's data and backup
# directories. A test (api config tests) checks that it parses and matches the built-in
# defaults but for those two.
set -euo pipefail
cd "$(dirname "$0")/../.."
echo "# tidemark's configuration (Debian package). Every setting below is commented out at its"
echo "# built-in default; uncomment and change what you need, then: systemctl restart tidemark."
echo "# Reference: /usr/share/doc/tidemark/configuration.md."
echo
awk '
  /^\[/ { section = $0 }
  /^[a-z_0-9]+ = / {
    if (section == "[server]" && $1 == "data") { print "data = \"/var/lib/tidemark\""; next }
    if (section == "[server]" && $1 == "backup_dir") { print "backup_dir = \"/var/backups/tidemark\""; next }
    print "# " $0; next
  }
  { print }
' api/src/defaults.toml
