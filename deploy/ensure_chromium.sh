#!/usr/bin/env bash
# Make sure Debian's Chromium is installed for the review UI's browser tests (Playwright drives
# /usr/bin/chromium headless; Playwright's own browser download is not used). Called by
# `make test` (and so by CI). Needs root (or sudo) only when Chromium is missing.
set -euo pipefail
if [ -x /usr/bin/chromium ]; then exit 0; fi
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "ensure_chromium: installing Debian's chromium for the UI tests" >&2
$sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
[ -x /usr/bin/chromium ] || { echo "ensure_chromium: /usr/bin/chromium is missing" >&2; exit 1; }
