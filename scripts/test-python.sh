#!/usr/bin/env bash
# Runs the Python worker SDK's tests (sdk/python/tests) with a Python >= 3.10 that has the modules
# they need: zmq (pyzmq), cryptography, pytest and mypy. Tries $CORRAL_PYTHON, then /usr/bin/python3
# (where Debian's packages go), then the python3 on PATH. `--check` only finds one and prints it.
# Extra arguments go to pytest, e.g. `npm run test:python -- -k stream`.
set -euo pipefail
cd "$(dirname "$0")/.."

has_modules() {
  "$1" -c 'import sys, zmq, cryptography, pytest, mypy; sys.exit(0 if sys.version_info >= (3, 10) else 1)' >/dev/null 2>&1
}

py=""
for candidate in "${CORRAL_PYTHON:-}" /usr/bin/python3 "$(command -v python3 || true)"; do
  if [ -n "$candidate" ] && [ -x "$candidate" ] && has_modules "$candidate"; then
    py="$candidate"
    break
  fi
done
if [ -z "$py" ]; then
  echo "test:python: no Python >= 3.10 with pyzmq, cryptography, pytest and mypy found" >&2
  echo "  on Debian/Ubuntu, as root: apt-get install -y --no-install-recommends python3-zmq python3-cryptography python3-pytest mypy" >&2
  echo "  or set CORRAL_PYTHON to a Python that has them (pip install pyzmq cryptography pytest mypy)" >&2
  exit 1
fi
if [ "${1:-}" = "--check" ]; then
  echo "$py"
  exit 0
fi
echo "test:python: $("$py" --version) ($py)"
exec "$py" -m pytest sdk/python/tests -q "$@"
