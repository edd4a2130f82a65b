#!/usr/bin/env bash
# promtool (checks and unit-tests deploy/prometheus/*.yml) into .tools/bin, without root: Debian's `prometheus`
# package is downloaded and unpacked, not installed, and only its promtool binary is kept (the server is not needed).
# Idempotent: a working .tools/bin/promtool is kept.
set -euo pipefail
DEST="${TOOLS_DIR:-.tools}/bin"
if "$DEST/promtool" --version >/dev/null 2>&1; then exit 0; fi
if ! command -v apt-get >/dev/null || ! command -v dpkg >/dev/null; then
  echo "scripts/promtool.sh: apt-get/dpkg not found (not Debian/Ubuntu): put a promtool from" \
       "https://prometheus.io/download/ at $DEST/promtool" >&2
  exit 1
fi
echo "downloading promtool (Debian's prometheus package, ~19 MB, once)"
TMP="$(mktemp -d)"; trap 'rm -rf "$TMP"' EXIT
# apt-get download writes into the current directory; it needs no root, only a package list (apt-get update).
# The Sandbox option: as root apt would download as its _apt user, which cannot write to this private folder.
fetch() { (cd "$TMP" && apt-get download -q -o APT::Sandbox::User=root prometheus >/dev/null 2>&1 && dpkg -x prometheus_*.deb x); }
# No package list yet (a fresh image): as root, fetch one and try again.
fetch || { [ "$(id -u)" = 0 ] && apt-get update -q >/dev/null && fetch; } || {
  echo "scripts/promtool.sh: 'apt-get download prometheus' failed: run 'apt-get update' (as root) and retry" >&2; exit 1; }
mkdir -p "$DEST"
install -m 755 "$TMP/x/usr/bin/promtool" "$DEST/promtool"
"$DEST/promtool" --version | head -1
