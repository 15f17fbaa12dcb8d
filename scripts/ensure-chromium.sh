#!/usr/bin/env bash
# Make sure a Chromium for the browser tests exists: Debian's package, installed when
# running as root (CI). Prints the executable's path; fails when none can be had.
set -euo pipefail
for p in "${CHROMIUM:-}" /usr/bin/chromium /usr/bin/chromium-browser; do
    if [ -n "$p" ] && [ -x "$p" ]; then echo "$p"; exit 0; fi
done
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing Debian's chromium for the browser tests" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q chromium >/dev/null 2>&1 \
        || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null 2>&1; }
    [ -x /usr/bin/chromium ] && { echo /usr/bin/chromium; exit 0; }
fi
echo "error: no Chromium found (install Debian's 'chromium' package or set CHROMIUM=)" >&2
exit 1
