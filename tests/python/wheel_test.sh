#!/usr/bin/env bash
# The attnaudit package builds and installs without the repository:
#   1. client/python is copied to a temporary folder outside the checkout;
#   2. `pip wheel` builds a wheel from that copy, with build isolation (the
#      pinned build backend of pyproject.toml), and an sdist;
#   3. the wheel holds the generated stubs, the .proto files and py.typed,
#      the sdist the .proto files;
#   4. the wheel installs into a fresh virtual environment and imports
#      there, from a folder outside the checkout.
# Every package comes from the wheelhouse make_venv.sh filled (no index is
# asked), so the test runs offline. Without that wheelhouse it is skipped
# (exit 77): `make py-venv` (or ctest's python_client_venv) fills it.
#
# usage: wheel_test.sh PY_VENV PYTHON CLIENT_PYTHON_DIR
set -euo pipefail

venv=$(realpath -m "$1")  # build/py-venv: has pip, and $venv/wheelhouse
python=$2                 # the interpreter for the fresh venv
client=$(cd "$3" && pwd)  # client/python of the checkout
wheelhouse="$venv/wheelhouse"

if [[ ! -d "$wheelhouse" ]]; then
  echo "wheel_test.sh: SKIP: no wheelhouse at $wheelhouse (build it with" \
       "'make py-venv'; it needs PyPI once)"
  exit 77
fi

tmp=$(mktemp -d /tmp/attnaudit_wheel_test.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
offline=(--no-index --find-links "$wheelhouse")

# 1. A copy without the repository around it (nor any build leftovers).
cp -R "$client" "$tmp/attnaudit-src"
rm -rf "$tmp/attnaudit-src/build" "$tmp/attnaudit-src"/src/*.egg-info
find "$tmp/attnaudit-src" -name __pycache__ -prune -exec rm -rf {} +
rm -f "$tmp"/attnaudit-src/src/attnaudit/v1/*_pb2*

# 2. The wheel, with the build backend pinned in pyproject.toml.
cd "$tmp"
env -u ATTNAUDIT_PROTO_DIR "${pip[@]}" wheel --no-deps "${offline[@]}" \
  -w "$tmp/dist" "$tmp/attnaudit-src"
wheel=$(ls "$tmp"/dist/attnaudit-*.whl)
(cd "$tmp/attnaudit-src" && env -u ATTNAUDIT_PROTO_DIR "$venv/bin/python" -c \
  "from setuptools import build_meta; build_meta.build_sdist('$tmp/sdist')" >/dev/null)
sdist=$(ls "$tmp"/sdist/attnaudit-*.tar.gz)

# 3. What they hold.
"$venv/bin/python" - "$wheel" "$sdist" "$client/proto/attnaudit/v1" <<'EOF'
import os, sys, tarfile, zipfile
wheel, sdist, protos = sys.argv[1:]
names = set(zipfile.ZipFile(wheel).namelist())
want = {"attnaudit/py.typed", "attnaudit/_version.py"}
for p in sorted(os.listdir(protos)):
    stem = p[:-len(".proto")]
    want |= {f"attnaudit/v1/{p}", f"attnaudit/v1/{stem}_pb2.py",
             f"attnaudit/v1/{stem}_pb2.pyi", f"attnaudit/v1/{stem}_pb2_grpc.py"}
missing = sorted(want - names)
assert not missing, f"the wheel lacks {missing}"
in_sdist = {n.split("/", 1)[1] for n in tarfile.open(sdist).getnames() if "/" in n}
missing = sorted(f"proto/attnaudit/v1/{p}" for p in os.listdir(protos)
                 if f"proto/attnaudit/v1/{p}" not in in_sdist)
assert not missing, f"the sdist lacks {missing}"
print(f"wheel_test.sh: {os.path.basename(wheel)}: {len(names)} files, "
      f"{len(os.listdir(protos))} protos with their stubs, py.typed")
EOF

# 4. A fresh venv, the wheel and its runtime dependencies, an import.
"$python" -m venv "$tmp/venv"
"$tmp/venv/bin/python" -m pip --disable-pip-version-check -q install \
  "${offline[@]}" "$wheel"
mkdir "$tmp/elsewhere"
cd "$tmp/elsewhere"
env -u PYTHONPATH "$tmp/venv/bin/python" - "$tmp/venv" <<'EOF'
import importlib.metadata, importlib.resources, os, sys
import attnaudit
from attnaudit.v1 import service_pb2, service_pb2_grpc
venv = os.path.realpath(sys.argv[1])
assert os.path.realpath(attnaudit.__file__).startswith(venv), attnaudit.__file__
assert attnaudit.__version__ == importlib.metadata.version("attnaudit")
assert callable(attnaudit.AuditClient)
assert service_pb2_grpc.AuditServiceStub is not None
assert str(attnaudit.Verdict.DRIFT) == "DRIFT"
proto = importlib.resources.files("attnaudit.v1") / "service.proto"
assert "service AuditService" in proto.read_text()
print(f"wheel_test.sh: attnaudit {attnaudit.__version__} imports in a fresh venv")
EOF
echo "wheel_test.sh: PASS"
