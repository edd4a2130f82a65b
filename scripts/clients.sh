#!/usr/bin/env bash
# The editor and agent clients the gateway is tested with (tests/test_clients.py), from npm into .tools/<client>, without
# root: the Continue CLI (`cn`). Pinned, so a new release cannot change what the tests see. Idempotent.
set -euo pipefail
DEST="${TOOLS_DIR:-.tools}"
CONTINUE_CLI="@continuedev/cli@1.5.47"
if [ -x "$DEST/continue/node_modules/.bin/cn" ] && grep -q '"version": "1.5.47"' "$DEST/continue/node_modules/@continuedev/cli/package.json" 2>/dev/null; then exit 0; fi
if ! command -v npm >/dev/null; then
  echo "scripts/clients.sh: npm not found: install Node.js 20 or newer (Debian: apt-get install nodejs npm) and retry" >&2; exit 1
fi
echo "installing the Continue CLI ($CONTINUE_CLI) into $DEST/continue"
mkdir -p "$DEST/continue"
npm install --prefix "$DEST/continue" --no-audit --no-fund --loglevel=error "$CONTINUE_CLI" >/dev/null
"$DEST/continue/node_modules/.bin/cn" --version
