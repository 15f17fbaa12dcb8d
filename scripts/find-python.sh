#!/usr/bin/env bash
# Print the path of a Python >= 3.12 interpreter, or fail with a clear message.
# The machine's default python3 may be older; pyenv shims refuse unless selected,
# so pyenv-installed interpreters are looked up by path.
set -euo pipefail

ok() { "$1" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)' >/dev/null 2>&1; }

candidates=()
[ -n "${PYTHON:-}" ] && candidates+=("$PYTHON")
for name in python3.14 python3.13 python3.12 python3; do
    p=$(command -v "$name" 2>/dev/null || true)
    [ -n "$p" ] && candidates+=("$p")
done
roots=()
if command -v pyenv >/dev/null 2>&1; then roots+=("$(pyenv root)"); fi
roots+=("${PYENV_ROOT:-$HOME/.pyenv}")
for root in "${roots[@]}"; do
    for p in $(ls -d "$root"/versions/3.1[2-9]*/bin/python 2>/dev/null | sort -rV); do
        candidates+=("$p")
    done
done
for p in /usr/local/bin/python3.1[2-9] /usr/bin/python3.1[2-9]; do
    [ -x "$p" ] && candidates+=("$p")
done

for p in "${candidates[@]}"; do
    if ok "$p"; then
        echo "$p"
        exit 0
    fi
done
echo "error: no Python >= 3.12 found (looked at \$PYTHON, python3.1x on PATH, pyenv versions)." >&2
echo "       Install Python 3.12+ or set PYTHON=/path/to/python3.12." >&2
exit 1
