"""Build hook: generates the attnaudit.v1 protobuf/gRPC stubs from proto/.

The stubs are written straight into the build directory (never into src/),
so a built package always carries the stubs of the .proto files it was built
from and nothing generated is ever committed. The proto directory is
$ATTNAUDIT_PROTO_DIR when set, else ../../proto next to this file (the
repository layout; `pip install ./client/python` builds in place).
"""

import glob
import os

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


def proto_dir():
    candidates = [os.environ.get("ATTNAUDIT_PROTO_DIR", ""),
                  os.path.join(HERE, "..", "..", "proto"),
                  os.path.join(HERE, "proto")]
    for path in candidates:
        if path and os.path.isdir(os.path.join(path, "attnaudit", "v1")):
            return os.path.abspath(path)
    raise RuntimeError(
        "attnaudit: cannot find the .proto files (looked for attnaudit/v1 under "
        + ", ".join(p for p in candidates if p)
        + "); build from the repository checkout or set ATTNAUDIT_PROTO_DIR")


def generate_stubs(out_dir):
    # Imported here: grpcio-tools is a build requirement, not a runtime one.
    import grpc_tools
    from grpc_tools import protoc

    src = proto_dir()
    protos = sorted(glob.glob(os.path.join(src, "attnaudit", "v1", "*.proto")))
    if not protos:
        raise RuntimeError(f"attnaudit: no .proto files under {src}/attnaudit/v1")
    well_known = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    out_dir = os.path.abspath(out_dir)
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


class BuildPyWithStubs(build_py):
    def run(self):
        super().run()
        generate_stubs(self.build_lib)


setup(cmdclass={"build_py": BuildPyWithStubs})
