"""The installed package's stubs are exactly the committed proto/.

protoc compiles proto/attnaudit/v1/*.proto afresh into a descriptor set; each
file's serialized FileDescriptorProto must equal the one embedded in the
installed attnaudit.v1.*_pb2 module. An edited .proto with a stale package
(or hand-edited stubs) fails here.
"""

from __future__ import annotations

import glob
import importlib
import os
import subprocess

import pytest
from google.protobuf import descriptor_pb2

import attnaudit.v1
from conftest import REPO

PROTO_DIR = os.environ.get("ATTNAUDIT_PROTO_DIR") or os.path.join(REPO, "proto")


def test_installed_stubs_match_the_proto_files(tmp_path):
    grpc_tools = pytest.importorskip("grpc_tools")
    from grpc_tools import protoc

    files = sorted(os.path.relpath(p, PROTO_DIR) for p in
                   glob.glob(os.path.join(PROTO_DIR, "attnaudit", "v1", "*.proto")))
    assert files, f"no .proto files under {PROTO_DIR}"
    out = str(tmp_path / "set.pb")
    well_known = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    rc = protoc.main(["protoc", f"-I{PROTO_DIR}", f"-I{well_known}",
                      f"--descriptor_set_out={out}", *[os.path.join(PROTO_DIR, f) for f in files]])
    assert rc == 0
    with open(out, "rb") as f:
        fresh = descriptor_pb2.FileDescriptorSet.FromString(f.read())
    assert sorted(fd.name for fd in fresh.file) == files
    for fd in fresh.file:
        module = importlib.import_module(
            "attnaudit.v1." + os.path.basename(fd.name)[:-len(".proto")] + "_pb2")
        # The Python generator embeds the descriptor without json_name (it
        # derives it at run time); everything else must be byte-identical.
        _clear_json_names(fd.message_type)
        assert module.DESCRIPTOR.serialized_pb == fd.SerializeToString(), (
            f"{fd.name}: the installed stubs differ from proto/; rebuild the "
            "package (pip install ./client/python)")
    installed = glob.glob(os.path.join(os.path.dirname(attnaudit.v1.__file__), "*_pb2.py"))
    assert len(installed) == len(files)


def _clear_json_names(messages) -> None:
    for m in messages:
        for f in list(m.field) + list(m.extension):
            f.ClearField("json_name")
        _clear_json_names(m.nested_type)


def test_stubs_are_not_committed():
    try:
        tracked = subprocess.run(
            ["git", "-C", REPO, "ls-files", "client/python/src/attnaudit/v1"],
            capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        pytest.skip("git is not available")
    if tracked.returncode != 0:
        pytest.skip("not a git checkout")
    assert tracked.stdout.split() == ["client/python/src/attnaudit/v1/__init__.py"]


def test_bundled_protos_match_the_proto_files():
    """client/python/proto (what the package builds from outside the
    repository) is a byte-identical copy of proto/attnaudit/v1."""
    bundled_dir = os.path.join(REPO, "client", "python", "proto", "attnaudit", "v1")
    source_dir = os.path.join(REPO, "proto", "attnaudit", "v1")
    bundled = sorted(os.listdir(bundled_dir))
    source = sorted(os.listdir(source_dir))
    hint = "; run client/python/scripts/sync_protos.sh (make py-protos)"
    assert bundled == source, f"client/python/proto has {bundled}, proto/ {source}" + hint
    for name in source:
        with open(os.path.join(bundled_dir, name), "rb") as a, \
                open(os.path.join(source_dir, name), "rb") as b:
            assert a.read() == b.read(), f"client/python/proto/attnaudit/v1/{name} differs" + hint


def test_one_version():
    """attnaudit.__version__ is the installed distribution's version (both
    come from attnaudit/_version.py)."""
    import importlib.metadata

    import attnaudit
    assert attnaudit.__version__ == importlib.metadata.version("attnaudit")


def test_enums_mirror_the_wire_enums():
    """Verdict, Comparison, JobState and Priority have exactly the values of
    their generated wire enums, under the names without the prefix."""
    from attnaudit import _enums

    for cls, module, name, prefix in _enums.MIRRORS:
        descriptor = getattr(importlib.import_module(f"attnaudit.v1.{module}"),
                             name).DESCRIPTOR
        wire = {v.name[len(prefix):]: v.number for v in descriptor.values}
        assert {m.name: m.value for m in cls} == wire, (
            f"attnaudit.{cls.__name__} differs from {module}.{name}; update "
            "client/python/src/attnaudit/_enums.py")


def test_enums_print_their_names():
    from attnaudit import JobState, Verdict

    assert str(Verdict.DRIFT) == "DRIFT" and f"{Verdict.PASS}" == "PASS"
    assert f"{JobState.DONE:>6}|" == "  DONE|" and f"{Verdict.DRIFT:d}" == "2"
    assert "%s" % Verdict.INVALID == "INVALID" and "%d" % Verdict.INVALID == "3"
    assert Verdict.DRIFT == 2 and Verdict(2) is Verdict.DRIFT
    assert repr(Verdict.PASS) == "<Verdict.PASS: 1>"
