"""The engine probe (attnaudit.probe) on numpy engines whose arithmetic is
known (attnaudit.probe.synthetic): it must recover each narrowing, each
rounding and the RoPE cast point, say "undetermined" rather than guess when
an engine fits no candidate, and resolve the presets by the CPU's ISA.

Runs in `make test`'s venv: numpy, no torch. The real engines are probed by
tests/conformance/probe_engines.py (`make conformance`).
"""

from __future__ import annotations

import json
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

from attnaudit import Snapshot, probe
from attnaudit.probe import _numerics as N
from attnaudit.probe import synthetic
from attnaudit.probe._types import AttentionOutput
from attnaudit.snapshot import engine_precision
from attnaudit.v1 import snapshot_pb2

SMALL = dict(head_dim=64, heads=(4, 2), max_keys=4096)


def fit(**kw):
    return probe.run(synthetic.engine(**{**SMALL, **kw}))


# ----------------------------------------------------------------------
# Rounding in numpy
# ----------------------------------------------------------------------


def _spread(n=200_000, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(n) * np.exp(rng.uniform(-18, 11, n))


def test_nearest_even_matches_ml_dtypes_and_numpy():
    x = _spread()
    x32 = x.astype(np.float32)
    assert np.array_equal(N.narrow(x, "bf16", "rne"),
                          x32.astype(ml_dtypes.bfloat16).astype(np.float64))
    with np.errstate(over="ignore"):
        assert np.array_equal(N.narrow(x, "f16", "rne"), x32.astype(np.float16).astype(np.float64))


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_truncation_never_grows_and_stays_within_an_ulp(dtype):
    x32 = _spread(seed=1).astype(np.float32).astype(np.float64)
    x32 = x32[np.abs(x32) < 60000]
    t = N.narrow(x32, dtype, "rtz")
    assert np.all(np.abs(t) <= np.abs(x32))
    assert np.all(np.abs(x32 - t) < N.spacing(t, dtype))
    assert not np.array_equal(t, N.narrow(x32, dtype, "rne"))


def test_ties_even_away_and_toward_zero():
    tie = np.array([1 + 2.0 ** -8, -(1 + 2.0 ** -8), 1 + 3 * 2.0 ** -8])
    assert list(N.narrow(tie, "bf16", "rne")) == [1.0, -1.0, 1 + 2.0 ** -6]
    assert list(N.narrow(tie, "bf16", "rna")) == [1 + 2.0 ** -7, -(1 + 2.0 ** -7),
                                                  1 + 2.0 ** -6]
    assert list(N.narrow(tie, "bf16", "rtz")) == [1.0, -1.0, 1 + 2.0 ** -7]
    half = np.array([1 + 2.0 ** -11])
    assert N.narrow(half, "f16", "rna")[0] == 1 + 2.0 ** -10
    assert N.narrow(half, "f16", "rtz")[0] == 1.0


# ----------------------------------------------------------------------
# Fits on synthetic engines
# ----------------------------------------------------------------------


def test_fp32_engine_rounding_to_nearest():
    r = fit()
    p = r.precision
    assert p["output_rounding"] == "nearest_even" and p["rope_rounding"] == "nearest_even"
    assert p["source"] == "measured" and p["profile"] == "custom"
    # fp32 scores and P are the custom profile's own assumption: not declared.
    assert "score_dtype" not in p and "probability_dtype" not in p
    assert r.measured["score_dtype"] == "f32" and r.measured["probability_dtype"] == "f32"
    assert r.cast_point == "after_rope"
    assert r.findings["long_rows"].value == "consistent"
    assert abs(r.findings["long_rows"].stats["bias_ulps"]) < 0.2


def test_truncating_engine():
    r = fit(output="rtz", cast_point="cos_sin")
    assert r.precision["output_rounding"] == "toward_zero"
    assert r.precision["rope_rounding"] == "toward_zero"
    assert r.cast_point == "cos_sin"
    out = r.findings["output"]
    assert out.decisive >= 256 and out.matched == out.decisive and out.runner_up_matched == 0
    assert -0.75 < r.findings["long_rows"].stats["bias_ulps"] < -0.25
    assert f"{out.matched}/{out.decisive}" in r.evidence


def test_bf16_scores_rounded_twice_and_normalised_probabilities():
    r = fit(scores="twice/rne", probabilities="norm/rne", cast_point="each_op")
    p = r.precision
    assert p["score_dtype"] == "bf16" and p["score_rounding"] == "nearest_even"
    assert p["probability_dtype"] == "bf16" and p["probability_rounding"] == "nearest_even"
    assert r.findings["scores"].stats["variant"] == "twice/rne"
    assert r.findings["probabilities"].stats["variant"] == "norm/rne"
    assert r.cast_point == "each_op"


def test_profile_assumptions_are_not_repeated():
    # An hf-eager-like engine under the hf_eager profile: its bf16 scores and
    # P are the profile's, so only the roundings are declared.
    r = fit(scores="twice/rne", probabilities="norm/rne", cast_point="each_op",
            profile="hf_eager")
    assert r.precision["profile"] == "hf_eager"
    assert "score_dtype" not in r.precision and "probability_dtype" not in r.precision
    assert r.measured["score_dtype"] == "bf16"


@pytest.mark.parametrize("variant", ["once/rtz", "twice/rtz"])
def test_truncated_scores(variant):
    r = fit(scores=variant)
    assert r.precision["score_dtype"] == "bf16"
    assert r.precision["score_rounding"] == "toward_zero"
    assert r.findings["scores"].stats["variant"] == variant


@pytest.mark.parametrize("variant", ["unnorm/rne", "unnorm/rtz", "unnorm_sum/rne"])
def test_bf16_probabilities(variant):
    r = fit(probabilities=variant)
    assert r.precision["probability_dtype"] == "bf16"
    assert r.findings["probabilities"].stats["variant"] == variant
    assert "score_dtype" not in r.precision
    want = "toward_zero" if variant.endswith("rtz") else "nearest_even"
    assert r.precision["probability_rounding"] == want


def test_f16_truncation():
    r = fit(dtype="f16", output="rtz", scores="twice/rne", probabilities="norm/rne")
    assert r.dtype == "f16"
    assert r.precision["output_rounding"] == "toward_zero"
    assert r.precision["score_dtype"] == "f16" and r.precision["probability_dtype"] == "f16"


@pytest.mark.parametrize("cast_point", ["after_rope", "cos_sin", "each_op"])
@pytest.mark.parametrize("rounding", ["rne", "rtz"])
@pytest.mark.parametrize("style", ["neox", "gptj"])
def test_rope_cast_points_bit_for_bit(cast_point, rounding, style):
    eng = synthetic.engine(cast_point=cast_point, rope_rounding=rounding, rope_style=style,
                           **SMALL)
    f = probe._rope.fit_rope(eng, np.random.default_rng(3))
    assert f.value == f"{cast_point}/{N.ROUNDING_NAMES[rounding]}"
    assert f.matched == f.cases and f.stats["max_position"] >= 60000
    assert f.runner_up_matched < f.cases


def test_f32_engine_has_no_casts():
    r = fit(dtype="f32")
    assert "output_rounding" not in r.precision and "rope_rounding" not in r.precision
    assert r.cast_point is None
    assert r.findings["rope"].value == "immaterial"


def test_exp_bound_covers_an_inaccurate_exp():
    clean = fit(cast_point=None)
    assert clean.measured["exp_ulps"] <= 2
    noisy = fit(exp_ulps=24, cast_point=None)
    bound = noisy.measured["exp_ulps"]
    assert 20 <= bound <= 28
    # Beyond the custom profile's 2 ulp: declared.
    assert noisy.precision["exp_ulps"] == bound
    assert clean.findings["rope"].value == "undetermined"   # no rotary op
    assert "rope_rounding" not in clean.precision


def test_lse_is_measured_when_the_op_returns_one():
    r = fit(lse=True, cast_point=None)
    assert r.findings["exp"].stats["lse_units"] < 4
    assert "lse_units" in r.findings["long_rows"].stats


# ----------------------------------------------------------------------
# The probe says when it cannot tell
# ----------------------------------------------------------------------


def _wrapped(op, change):
    def out(q, ks, vs, scale):
        res = op(q, ks, vs, scale)
        return AttentionOutput(change(res.out, ks), res.lse)
    return out


def test_an_output_that_fits_no_rounding_is_undetermined():
    eng = synthetic.engine(**SMALL, cast_point=None)
    rng = np.random.default_rng(5)
    # Every other element one ulp off, up or down at random.
    eng.attention = _wrapped(eng.attention, lambda o, ks: N.narrow(
        o + (rng.random(o.shape) < 0.5) * rng.choice([-1, 1], o.shape) * N.spacing(o, "bf16"),
        "bf16"))
    r = probe.run(eng)
    assert r.findings["output"].value == "undetermined"
    assert "output_rounding" not in r.precision


def test_long_rows_catch_what_short_rows_miss():
    # Truncates only in rows longer than 2,048 keys: the crafted rows (up to
    # 1,024 keys) say nearest, the long-row check disagrees.
    eng = synthetic.engine(**SMALL, cast_point=None)
    near = eng.attention
    trunc = synthetic.attention_op("bf16", output="rtz")

    def op(q, ks, vs, scale):
        a, b = near(q, ks, vs, scale), trunc(q, ks, vs, scale)
        long = np.array([k.shape[0] > 2048 for k in ks])[:, None, None]
        return AttentionOutput(np.where(long, b.out, a.out))

    eng.attention = op
    r = probe.run(eng)
    assert r.precision["output_rounding"] == "nearest_even"
    assert r.findings["long_rows"].value == "inconsistent"
    assert "disagrees" in r.evidence


def test_an_adapter_returning_wider_values_is_refused():
    eng = synthetic.engine(**SMALL)
    eng.attention = _wrapped(eng.attention, lambda o, ks: o * (1 + 2.0 ** -12))
    with pytest.raises(ValueError, match="not bf16"):
        probe.run(eng)


# ----------------------------------------------------------------------
# Evidence, the wire, presets, the CLI
# ----------------------------------------------------------------------


def test_evidence_is_one_bounded_line_that_travels():
    r = fit(output="rtz", cast_point="cos_sin")
    ev = r.evidence
    assert "\n" not in ev and len(ev.encode()) <= 1024
    assert ev.startswith("measured on ") and ("avx512_bf16" in ev or "asimd" in ev)
    msg = engine_precision(r.precision)
    assert msg.source == snapshot_pb2.PRECISION_SOURCE_MEASURED
    assert msg.output_rounding == snapshot_pb2.ROUNDING_TOWARD_ZERO
    assert msg.rope_rounding == snapshot_pb2.ROUNDING_TOWARD_ZERO
    assert msg.evidence == ev
    json.dumps(r.to_dict())
    assert probe.truncate_utf8("é" * 600, 1024).encode().__len__() <= 1024


def test_snapshot_carries_the_measured_precision():
    r = fit(output="rtz", cast_point="cos_sin")
    opts = r.snapshot_options()
    B, H, Hkv, D, page = 1, 4, 2, 64, 16
    rng = np.random.default_rng(0)
    snap = Snapshot.from_paged_kv(
        rng.standard_normal((B, H, D)).astype(np.float32),
        rng.standard_normal((2, page, Hkv, D)).astype(np.float32),
        rng.standard_normal((2, page, Hkv, D)).astype(np.float32),
        np.array([[0, 1]], np.int32), np.array([20], np.int32), layout="nhd",
        precision=opts["precision"],
        rope={"theta": 10000.0, "q_state": "post", "k_state": "post",
              "cast_point": opts["cast_point"]})
    meta = snap.meta
    assert meta.precision.source == snapshot_pb2.PRECISION_SOURCE_MEASURED
    assert meta.precision.output_rounding == snapshot_pb2.ROUNDING_TOWARD_ZERO
    assert meta.rope.cast_point == snapshot_pb2.ROPE_CAST_POINT_COS_SIN


@pytest.mark.parametrize("flags,want", [
    ("fpu avx2 fma f16c", "toward_zero"),
    ("fpu avx2 avx512f avx512_bf16", "nearest_even"),
    ("fpu avx2 avx512f amx_bf16", "nearest_even"),
])
def test_vllm_cpu_preset_resolves_rounding_by_isa(flags, want):
    p = probe.preset("vllm-cpu", "bf16", cpu={"model": "Some CPU", "flags": set(flags.split())})
    assert p["profile"] == "vllm_cpu" and p["source"] == "preset"
    assert p["output_rounding"] == want and p["rope_rounding"] == want
    assert "Some CPU" in p["evidence"]


def test_presets_without_isa_knowledge_leave_rounding_alone():
    assert "output_rounding" not in probe.preset("vllm-cpu", "f16")
    arm = probe.preset("vllm-cpu", "bf16", cpu={"model": "Neoverse", "flags": {"asimd", "bf16"}})
    assert "output_rounding" not in arm and "ISA unknown" in arm["evidence"]
    assert "output_rounding" not in probe.preset("hf-eager", "bf16")
    with pytest.raises(ValueError, match="unknown"):
        probe.preset("nope", "bf16")


def test_snapshot_engine_preset_is_resolved_for_this_host():
    import ml_dtypes as md
    B, H, Hkv, D, page = 1, 4, 2, 64, 16
    rng = np.random.default_rng(0)
    bf = md.bfloat16
    snap = Snapshot.from_paged_kv(
        rng.standard_normal((B, H, D)).astype(bf),
        rng.standard_normal((2, page, Hkv, D)).astype(bf),
        rng.standard_normal((2, page, Hkv, D)).astype(bf),
        np.array([[0, 1]], np.int32), np.array([20], np.int32), layout="nhd",
        engine="vllm-cpu")
    prec = snap.meta.precision
    assert prec.source == snapshot_pb2.PRECISION_SOURCE_PRESET
    want = probe.preset("vllm-cpu", "bf16")
    assert prec.evidence == want["evidence"]
    if "output_rounding" in want:
        assert snapshot_pb2.Rounding.Name(prec.output_rounding).lower().endswith(
            want["output_rounding"])


def test_cli_without_torch_says_what_is_missing():
    proc = subprocess.run([sys.executable, "-m", "attnaudit.probe", "--engine", "vllm-cpu"],
                          capture_output=True, text=True, timeout=120)
    try:
        import torch  # noqa: F401
    except ImportError:
        assert proc.returncode == 2, proc.stderr
        assert "not installed" in proc.stderr
    else:  # a venv with torch (the conformance venv): the probe runs
        assert proc.returncode in (0, 1, 2), proc.stderr


def test_partial_rotary_fits_the_rotated_part_and_checks_the_rest():
    eng = synthetic.engine(**SMALL)
    eng.rope = synthetic.rope_op("bf16", cast_point="cos_sin", rounding="rtz", rotary_dim=32)
    f = probe._rope.fit_rope(eng, np.random.default_rng(0))
    assert f.value == "cos_sin/toward_zero" and f.stats["rotary_dim"] == 32
    inner = eng.rope

    def broken(x, positions):
        res = inner(x, positions)
        res.out[..., -1] += 1.0            # touches a dimension it must pass through
        return res

    eng.rope = broken
    f = probe._rope.fit_rope(eng, np.random.default_rng(0))
    assert f.value == "undetermined" and f.stats["pass_through_changed"] > 0
