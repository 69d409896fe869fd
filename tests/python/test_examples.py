"""The examples: the sketches compile; the torch decode loop runs against
the real server (when torch is installed) and its audits catch the stale
page it injects."""

from __future__ import annotations

import os
import py_compile
import subprocess
import sys

import pytest

from conftest import REPO

EXAMPLES = os.path.join(REPO, "client", "python", "examples")


@pytest.mark.parametrize("name", sorted(f for f in os.listdir(EXAMPLES) if f.endswith(".py")))
def test_examples_compile(name, tmp_path):
    py_compile.compile(os.path.join(EXAMPLES, name), cfile=str(tmp_path / "x.pyc"),
                       doraise=True)


def test_torch_decode_loop_audits_itself(server):
    pytest.importorskip("torch", reason="torch is not installed (make test does not "
                        "install it; `make bench-python` does)")
    p = subprocess.run(
        [sys.executable, os.path.join(EXAMPLES, "torch_decode_loop.py"), "--addr",
         server.address, "--steps", "17", "--layers", "2", "--sample-every", "8",
         "--fault", "stale-page", "--fault-step", "4",
         "--max-in-flight", "6"],  # room for every sampled call: nothing dropped
        capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    first = p.stdout.splitlines()[0]
    # Steps 0, 8, 16 x layers 0, 1; layer 1 reads a stale page from step 4.
    assert "sampled=6 sent=6 dropped=0 passed=4 drifted=2" in first, p.stdout
