#!/usr/bin/env bash
# Installs what the console's browser test needs (tests/tests/e2e/e2e_console.rs): Debian's
# Chromium (/usr/bin/chromium) and playwright-core from the npm registry, at the version
# package-lock.json pins (`npm ci`; playwright-core downloads no browser of its own).
# Idempotent. Needs root for apt-get unless Chromium is present already.
set -euo pipefail
cd "$(dirname "$0")"
if ! command -v chromium >/dev/null 2>&1; then
  if [[ $(id -u) -ne 0 ]]; then
    echo "tests/browser/install.sh: need root to apt-get install chromium" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends chromium >/dev/null
fi
command -v node >/dev/null 2>&1 || { echo "node (Node.js) is required" >&2; exit 1; }
npm ci --no-audit --no-fund --loglevel=error
echo "browser test: $(chromium --version 2>/dev/null), playwright-core $(node -p 'require("./node_modules/playwright-core/package.json").version')"
