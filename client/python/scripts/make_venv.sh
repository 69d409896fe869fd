#!/usr/bin/env bash
# Creates or updates a virtual environment with exactly pinned PyPI packages
# and installs the attnaudit package built from this checkout into it.
#
# usage: make_venv.sh VENV_DIR PYTHON REQUIREMENTS_FILE [WHEELHOUSE_DIR]
#
# With WHEELHOUSE_DIR the pinned packages are first downloaded there as
# wheels and installed from there; later steps (the wheel test,
# tests/python/wheel_test.sh) can then install them offline with
# --no-index --find-links WHEELHOUSE_DIR.
#
# Idempotent and cheap when nothing changed: the pinned packages are
# reinstalled only when the requirements files change (a hash stamp in the
# venv); the package itself is rebuilt every time (a few seconds), from a
# copy of client/python, so its stubs always come from the current proto/
# and the source tree is never written to.
set -euo pipefail

venv=$1
python=$2
req=$3
wheelhouse=${4:-}
here=$(cd "$(dirname "$0")/.." && pwd)  # client/python
repo=$(cd "$here/../.." && pwd)

if [[ ! -x "$venv/bin/python" ]]; then
  if ! "$python" -m venv "$venv"; then
    echo "make_venv.sh: '$python -m venv' failed; on Debian/Ubuntu install" \
         "python3-venv (make deps does)" >&2
    exit 1
  fi
fi

# The stamp covers the file and every file it includes with -r.
req_files=("$req")
while read -r inc; do req_files+=("$(dirname "$req")/$inc"); done \
  < <(sed -n 's/^-r[[:space:]]*//p' "$req")
want=$(cat "${req_files[@]}" | sha256sum | cut -d' ' -f1)
stamp="$venv/.requirements.sha256"
if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$want" ||
      ( -n "$wheelhouse" && ! -d "$wheelhouse" ) ]]; then
  if [[ -n "$wheelhouse" ]]; then
    rm -rf "$wheelhouse"
    "$venv/bin/python" -m pip download --disable-pip-version-check -q \
      --only-binary=:all: -d "$wheelhouse" -r "$req"
    "$venv/bin/python" -m pip install --disable-pip-version-check -q \
      --no-index --find-links "$wheelhouse" -r "$req"
  else
    "$venv/bin/python" -m pip install --disable-pip-version-check -q -r "$req"
  fi
  echo "$want" >"$stamp"
fi

src="$venv/.attnaudit-src"
rm -rf "$src"
mkdir -p "$src"
cp -R "$here/pyproject.toml" "$here/setup.py" "$here/MANIFEST.in" "$here/README.md" \
  "$here/src" "$src/"
find "$src" -name __pycache__ -prune -exec rm -rf {} +
rm -rf "$src"/src/*.egg-info "$src"/src/attnaudit/v1/*_pb2*
ATTNAUDIT_PROTO_DIR="$repo/proto" "$venv/bin/python" -m pip install \
  --disable-pip-version-check -q --no-build-isolation --no-deps \
  --force-reinstall "$src"
echo "make_venv.sh: attnaudit installed in $venv"
