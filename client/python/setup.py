"""Build hook: generates the attnaudit.v1 protobuf/gRPC stubs from .proto files.

The stubs are written straight into the build directory (never into src/),
so a built package always carries the stubs of the .proto files it was built
from and nothing generated is ever committed. The .proto files themselves
ship inside the package too (attnaudit/v1/*.proto, beside their stubs).

Where the .proto files come from, first match wins:
  1. $ATTNAUDIT_PROTO_DIR, when set;
  2. the repository's proto/, when this directory is client/python of a
     checkout (so a build from the repository always speaks its contract);
  3. proto/ next to this file: the copy that travels with client/python
     and its sdist, so the package builds anywhere (`pip wheel` of a copy
     of this directory, or of the sdist). scripts/sync_protos.sh refreshes
     it from the repository and a test fails when it differs.
"""

import glob
import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


def _has_protos(path):
    return bool(path) and os.path.isdir(os.path.join(path, "attnaudit", "v1"))


def _repository_proto_dir():
    """The checkout's proto/ when this file is its client/python, else ""."""
    root = os.path.dirname(os.path.dirname(HERE))
    this = os.path.join(root, "client", "python")
    if os.path.isdir(this) and os.path.samefile(this, HERE):
        return os.path.join(root, "proto")
    return ""


def proto_dir():
    candidates = [os.environ.get("ATTNAUDIT_PROTO_DIR", ""),
                  _repository_proto_dir(),
                  os.path.join(HERE, "proto")]
    for path in candidates:
        if _has_protos(path):
            return os.path.abspath(path)
    raise RuntimeError(
        "attnaudit: cannot find the .proto files (looked for attnaudit/v1 under "
        + ", ".join(p for p in candidates if p)
        + "); build from the repository checkout, from a copy of client/python "
          "with its proto/ folder, or set ATTNAUDIT_PROTO_DIR")


def generate_stubs(src, protos, out_dir):
    # Imported here: grpcio-tools is a build requirement, not a runtime one.
    import grpc_tools
    from grpc_tools import protoc

    well_known = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    os.makedirs(out_dir, exist_ok=True)
    args = ["grpc_tools.protoc", f"-I{src}", f"-I{well_known}",
            f"--python_out={out_dir}", f"--pyi_out={out_dir}",
            f"--grpc_python_out={out_dir}"] + [os.path.relpath(p, src) for p in protos]
    # protoc resolves the relative names against -I; run from the proto dir.
    cwd = os.getcwd()
    os.chdir(src)
    try:
        rc = protoc.main(args)
    finally:
        os.chdir(cwd)
    if rc != 0:
        raise RuntimeError(f"attnaudit: protoc failed with exit code {rc}")


def build_stubs(out_dir):
    """Stubs and .proto files of attnaudit/v1 into out_dir (a build_lib)."""
    src = proto_dir()
    protos = sorted(glob.glob(os.path.join(src, "attnaudit", "v1", "*.proto")))
    if not protos:
        raise RuntimeError(f"attnaudit: no .proto files under {src}/attnaudit/v1")
    out_dir = os.path.abspath(out_dir)
    generate_stubs(src, protos, out_dir)
    # The contract ships beside its stubs: -I<site-packages> resolves the
    # files' own imports ("attnaudit/v1/tensor.proto").
    package = os.path.join(out_dir, "attnaudit", "v1")
    for stale in glob.glob(os.path.join(package, "*.proto")):
        os.remove(stale)
    for proto in protos:
        shutil.copyfile(proto, os.path.join(package, os.path.basename(proto)))


class BuildPyWithStubs(build_py):
    def run(self):
        super().run()
        build_stubs(self.build_lib)


setup(cmdclass={"build_py": BuildPyWithStubs})
