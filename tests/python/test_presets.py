"""The package's engine presets are the server's.

core/engine/presets.h is the one table of the engine presets; the package
carries a copy generated from it (attnaudit/_presets.py, written by
client/python/scripts/gen_presets.py) so that it installs without the
repository. `attnaudit presets --json` prints the C++ table, and these tests
fail on any difference: a file that is not what the generator writes, a
preset or a family on one side only, or one that resolves to another
precision profile or RoPE cast point on the wire.
"""

import importlib.util
import json
import os

import pytest

from attnaudit import ENGINE_PRESETS, HF_FAMILY_CAST_POINTS
from attnaudit import _enums as E
from attnaudit import snapshot


@pytest.fixture(scope="module")
def cpp(cli) -> dict:
    return json.loads(cli.run("presets", "--json").stdout)


def _profile(name: str) -> int:
    return E.parse_enum(*E.ENGINE_PROFILE, name, "profile", E.PROFILE_ALIASES)


def _cast_point(name: str) -> int:
    return E.parse_enum(*E.CAST_POINT, name, "cast_point")


PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "client", "python")


def _generator():
    path = os.path.join(PACKAGE, "scripts", "gen_presets.py")
    spec = importlib.util.spec_from_file_location("gen_presets", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_package_file_is_generated_from_the_table(cpp):
    gen = _generator()
    with open(os.path.join(PACKAGE, "src", "attnaudit", "_presets.py"), encoding="utf-8") as f:
        assert f.read() == gen.render(cpp), "run make py-presets"


def test_the_same_presets(cpp):
    assert sorted(ENGINE_PRESETS) == sorted(cpp["engine_presets"])


@pytest.mark.parametrize("name", sorted(ENGINE_PRESETS))
def test_each_preset_declares_what_the_server_table_does(cpp, name):
    py, cc = ENGINE_PRESETS[name], cpp["engine_presets"][name]
    assert set(py) == {"precision", "cast_point"}
    assert _profile(py["precision"]) == _profile(cc["precision"])
    assert _cast_point(py["cast_point"]) == _cast_point(cc["cast_point"])
    # What a builder declares for it.
    assert snapshot._engine_preset(name) == py


def test_the_same_hf_families(cpp):
    assert HF_FAMILY_CAST_POINTS == cpp["hf_family_cast_points"]
    for base in ("hf-eager", "hf-sdpa"):
        for family, point in cpp["hf_family_cast_points"].items():
            got = snapshot._engine_preset(f"{base}/{family}")
            assert got is not None and got["cast_point"] == point
        unlisted = snapshot._engine_preset(f"{base}/no-such-family")
        assert unlisted is not None
        assert unlisted["cast_point"] == cpp["hf_default_cast_point"]
