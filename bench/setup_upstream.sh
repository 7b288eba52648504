#!/usr/bin/env bash
# Idempotent set-up of the comparison peers for the benchmarks:
#   - bench/.venv-upstream: the upstream Rust-backed `sandlock` wheel (0.9.0). Its
#     distribution name clashes with ours, so it lives only in this venv and is only
#     ever imported by bench/worker.py running under this venv's python.
#   - bubblewrap (bwrap) and redis-server from Debian, if missing.
set -euo pipefail

UPSTREAM_VERSION=0.9.0
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="$here/.venv-upstream"

# Run the check from / so the project's own sandlock/ is never on sys.path.
have_upstream() {
    [ -x "$venv/bin/python" ] && (cd / && "$venv/bin/python" -c \
        "import sandlock, sys; sys.exit(sandlock.__version__ != '$UPSTREAM_VERSION')") 2>/dev/null
}

if have_upstream; then
    echo "upstream sandlock $UPSTREAM_VERSION: present in $venv"
else
    echo "upstream sandlock $UPSTREAM_VERSION: installing into $venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q "sandlock==$UPSTREAM_VERSION"
    have_upstream || { echo "upstream sandlock did not import after install" >&2; exit 1; }
fi

missing=()
command -v bwrap >/dev/null || missing+=(bubblewrap)
command -v redis-server >/dev/null && command -v redis-benchmark >/dev/null || missing+=(redis-server)
if [ ${#missing[@]} -gt 0 ]; then
    echo "installing from Debian: ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
echo "bwrap: $(command -v bwrap)  redis-server: $(command -v redis-server)"
