#!/usr/bin/env bash
# Print the path of a Python interpreter, or fail with a clear message.
#   scripts/find-python.sh          any Python >= 3.12 (the newest found)
#   scripts/find-python.sh 3.12     exactly Python 3.12.x
# The machine's default python3 may be older; pyenv shims refuse unless selected,
# so pyenv-installed interpreters are looked up by path.
set -euo pipefail

want=${1:-}
if [ -n "$want" ]; then
    check="import sys; sys.exit(0 if '%d.%d' % sys.version_info[:2] == '$want' else 1)"
else
    check='import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)'
fi
ok() { "$1" -c "$check" >/dev/null 2>&1; }

candidates=()
[ -n "${PYTHON:-}" ] && candidates+=("$PYTHON")
names=(python3.14 python3.13 python3.12 python3)
[ -n "$want" ] && names=("python$want" python3)
for name in "${names[@]}"; do
    p=$(command -v "$name" 2>/dev/null || true)
    [ -n "$p" ] && candidates+=("$p")
done
roots=()
if command -v pyenv >/dev/null 2>&1; then roots+=("$(pyenv root)"); fi
roots+=("${PYENV_ROOT:-$HOME/.pyenv}")
pattern=${want:-3.1[2-9]}
for root in "${roots[@]}"; do
    for p in $(ls -d "$root"/versions/$pattern*/bin/python 2>/dev/null | sort -rV); do
        candidates+=("$p")
    done
done
for p in /usr/local/bin/python$pattern /usr/bin/python$pattern; do
    [ -x "$p" ] && candidates+=("$p")
done

for p in "${candidates[@]}"; do
    if ok "$p"; then
        echo "$p"
        exit 0
    fi
done
if [ -n "$want" ]; then
    echo "error: no Python $want found (looked at \$PYTHON, python$want on PATH, pyenv versions)." >&2
    echo "       Install Python $want or set PYTHON=/path/to/python$want." >&2
else
    echo "error: no Python >= 3.12 found (looked at \$PYTHON, python3.1x on PATH, pyenv versions)." >&2
    echo "       Install Python 3.12+ or set PYTHON=/path/to/python3.12." >&2
fi
exit 1
