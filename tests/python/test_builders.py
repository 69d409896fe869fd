"""Snapshot builders: every engine layout gives the CLI's report.

The oracle is the C++ CLI: `attnaudit synth` writes a snapshot whose engine
outputs come from its simulated flash-decoding kernel, `attnaudit check`
audits that file offline. The test re-lays the same data out as each engine
would hold it (engine_layouts.py), builds a snapshot with
Snapshot.from_paged_kv, audits it on the server, and requires the same
report, field for field, apart from wall times, thread counts and the
placement-dependent RoPE digest.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import attnaudit
from attnaudit import fingerprint
from attnaudit.v1 import snapshot_pb2, tensor_pb2
from conftest import comparable, report_json
from engine_layouts import LAYOUTS, engine_tensors, to_torch

try:
    import torch  # noqa: F401
    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False

# Two synthetic snapshots: (1) offset positions (odd rows start at 1000 b + 3)
# and fp8 pages with per-head scales; (2) a prefix shared by every row (the
# same pages in several rows), two queries per row, sinks and a sliding
# window (gpt-oss, even layer), bf16 pages.
CASES = {
    "llama3_fp8_offsets": ["--preset", "llama3-8b", "--batch", "3", "--context", "150",
                           "--kv-dtype", "fp8_e4m3", "--permute-pages", "--seed", "3"],
    "gptoss_prefix_sq2": ["--preset", "gpt-oss-20b", "--batch", "3", "--context", "170",
                          "--prefix", "40", "--queries", "2", "--layer", "2",
                          "--permute-pages", "--seed", "5"],
}


@pytest.fixture(scope="module", params=sorted(CASES))
def synth_case(request, cli, tmp_path_factory):
    path = str(tmp_path_factory.mktemp("synth") / f"{request.param}.pb")
    cli.synth(path, *CASES[request.param])
    return path, cli.check_json(path)


def _without_pages(d: dict) -> dict:
    d = comparable(d)
    d["dims"].pop("num_pages", None)
    d["dims"].pop("max_blocks", None)
    return d


@pytest.mark.parametrize("layout", LAYOUTS)
def test_layout_matches_cli_report(synth_case, layout, client):
    path, expected = synth_case
    original = attnaudit.Snapshot.load(path)
    args, kwargs, engine_id = engine_tensors(original, layout)
    snap = attnaudit.Snapshot.from_paged_kv(*args, **kwargs)

    # Only the referenced pages went in, under the engine's ids.
    referenced = np.unique(engine_id[np.unique(_pool_indices(original))])
    np.testing.assert_array_equal(snap.tensor("page_ids"), referenced)
    assert snap.tensor("k_pages").shape[0] == len(referenced)

    report = client.audit(snap)
    assert _without_pages(report_json(report)) == _without_pages(expected)
    assert report.dims.num_pages == len(referenced)


@pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed (make test "
                    "does not install it; `make bench-python` does)")
@pytest.mark.parametrize("layout", ["vllm", "flashinfer_hnd"])
def test_torch_tensors_match_cli_report(synth_case, layout, client):
    path, expected = synth_case
    original = attnaudit.Snapshot.load(path)
    args, kwargs, _ = engine_tensors(original, layout)
    targs, tkwargs = to_torch(args, kwargs)
    snap = attnaudit.Snapshot.from_paged_kv(*targs, **tkwargs)
    assert _without_pages(report_json(client.audit(snap))) == _without_pages(expected)


def _pool_indices(snap) -> np.ndarray:
    bt = snap.tensor("block_table")
    return bt[bt >= 0]


def test_saved_file_is_the_cli_format(synth_case, client, cli, tmp_path):
    path, expected = synth_case
    args, kwargs, _ = engine_tensors(attnaudit.Snapshot.load(path), "flashinfer_nhd")
    snap = attnaudit.Snapshot.from_paged_kv(*args, **kwargs)
    saved = str(tmp_path / "built.pb")
    snap.save(saved)
    # The CLI reads the file back and reports what the server reported.
    offline = cli.check_json(saved)
    assert comparable(offline) == comparable(report_json(client.audit(snap)))
    assert _without_pages(offline) == _without_pages(expected)
    again = attnaudit.Snapshot.load(saved)
    assert again.serialize() == snap.serialize()
    assert not [f for f in os.listdir(tmp_path) if ".tmp." in f]
    # Like the C++ writer, save() puts every tensor's bytes at a 64-byte
    # aligned offset of the file, so the CLI maps them without copying.
    with open(saved, "rb") as f:
        raw = f.read()
    for name in ("q", "k_pages", "v_pages", "block_table"):
        data = np.ascontiguousarray(snap.tensor(name)).tobytes()
        offset = raw.find(data)
        assert offset >= 0 and offset % 64 == 0, (name, offset)


def test_prefix_fingerprint_auto_and_kv_fingerprint(client, cli, tmp_path):
    path = cli.synth(str(tmp_path / "p.pb"), "--preset", "qwen3-8b", "--batch", "2",
                     "--context", "90", "--prefix", "35", "--permute-pages")
    original = attnaudit.Snapshot.load(path)
    # Our independent implementation of the v1 digest reproduces synth's.
    assert fingerprint.prefix_fingerprint(
        original, original.meta.prefix.length,
        original.meta.prefix.key) == original.meta.prefix.fingerprint
    args, kwargs, _ = engine_tensors(original, "hnd")
    kwargs["prefix_fingerprint"] = "auto"
    snap = attnaudit.Snapshot.from_paged_kv(*args, **kwargs)
    report = client.audit(snap, options={"compute_kv_fingerprint": True})
    assert snap.meta.prefix.fingerprint == original.meta.prefix.fingerprint
    assert report.provenance.prefix_fingerprint == original.meta.prefix.fingerprint
    assert report.provenance.kv_fingerprint == fingerprint.kv_cache_fingerprint(snap)
    # A wrong declared fingerprint is refused, naming the field.
    kwargs["prefix_fingerprint"] = "0" * 64
    with pytest.raises(attnaudit.InvalidArgumentError) as e:
        client.audit(attnaudit.Snapshot.from_paged_kv(*args, **kwargs))
    assert e.value.field_path == "snapshot.prefix.fingerprint"


def test_builder_copies_inputs_once_and_owns_them(client, cli, tmp_path):
    path = cli.synth(str(tmp_path / "s.pb"), "--preset", "phi4-mini", "--context", "64")
    original = attnaudit.Snapshot.load(path)
    args, kwargs, _ = engine_tensors(original, "vllm")
    args = (args[0].copy(),) + args[1:]  # writable, as an engine's are
    kwargs["engine_out"] = kwargs["engine_out"].copy()
    snap = attnaudit.Snapshot.from_paged_kv(*args, **kwargs)
    before = snap.serialize()
    for a in (args[0], args[1], kwargs["engine_out"]):
        a[...] = 0  # the engine reuses its buffers right after the hook
    assert snap.serialize() == before


def test_lse_base_is_required_with_an_engine_lse():
    q = np.zeros((1, 2, 8), np.float32)
    kv = np.zeros((2, 2, 4, 1, 8), np.float32)
    common = dict(layout="vllm", engine_lse=np.zeros((1, 2), np.float32))
    with pytest.raises(ValueError, match="lse_base: required"):
        attnaudit.Snapshot.from_paged_kv(q, kv, None, [[0]], [3], **common)
    snap = attnaudit.Snapshot.from_paged_kv(q, kv, None, [[0]], [3], lse_base="2", **common)
    assert snap.meta.engine.lse_base == 2


@pytest.mark.parametrize("kwargs, message", [
    (dict(engine_lse=np.zeros((2, 1), np.float32), lse_base="e"), r"engine_lse: .*\[Hq, B\]"),
    (dict(engine_out=np.zeros((1, 3, 8), np.float32)), "engine_out: shape"),
    (dict(lm_head=np.zeros((5, 7), np.float32)), r"lm_head: shape .* \[V, Hq\*D=16\]"),
    (dict(rope={"theta": 1e4, "bogus": 1}), "rope: unknown key"),
    (dict(rope={"style": "spiral"}), "rope.style: unknown value"),
    (dict(window_convention="sideways"), "window_convention: unknown value"),
    (dict(labels={"modle": "x"}), "labels: unknown key"),
])
def test_builder_argument_errors_name_the_argument(kwargs, message):
    q = np.zeros((1, 2, 8), np.float32)
    kv = np.zeros((2, 2, 4, 1, 8), np.float32)
    with pytest.raises((ValueError, TypeError), match=message):
        attnaudit.Snapshot.from_paged_kv(q, kv, None, [[1]], [3], layout="vllm", **kwargs)


def test_builder_paging_errors():
    q = np.zeros((2, 2, 8), np.float32)
    kv = np.zeros((2, 3, 4, 1, 8), np.float32)
    with pytest.raises(ValueError, match=r"block_table\[1\]\[0\]: page id 7 is outside"):
        attnaudit.Snapshot.from_paged_kv(q, kv, None, [[0, 1], [7, 0]], [5, 3])
    with pytest.raises(ValueError, match="row 0 needs 3 blocks"):
        attnaudit.Snapshot.from_paged_kv(q, kv, None, [[0, 1], [2, 0]], [9, 3])
    # Page 0 as block 0 of row 0 and block 1 of row 1: positions clash.
    with pytest.raises(ValueError, match=r"block_table\[1\]\[1\]: page id 0 is shared"):
        attnaudit.Snapshot.from_paged_kv(q, kv, None, [[0, 1], [2, 0]], [5, 6])
    with pytest.raises(ValueError, match="fused K/V tensor"):
        attnaudit.Snapshot.from_paged_kv(q, kv, None, [[0], [1]], [1, 1], layout="hnd")


def test_f64_arrays_stay_f64_and_bf16_works_without_torch():
    import ml_dtypes
    q = np.ones((1, 1, 2, 4), np.float64)
    kv = np.ones((2, 1, 4, 1, 4), dtype=ml_dtypes.bfloat16)
    snap = attnaudit.Snapshot.from_paged_kv(q, kv, None, [[0]], [2],
                                            engine_out=np.ones((1, 2, 4)),
                                            engine_lse=np.ones((1, 2)), lse_base="e")
    assert snap.wire_tensor("q").dtype == 6  # DTYPE_F64
    assert snap.wire_tensor("engine.out").dtype == 6
    assert snap.wire_tensor("engine.lse").dtype == 6
    assert snap.wire_tensor("k_pages").dtype == 3  # DTYPE_BF16
    assert snap.tensor("k_pages").dtype == ml_dtypes.bfloat16


def test_encoding_waits_for_pending_device_copies():
    """The CUDA path without a GPU: a tensor whose bytes are still being
    copied off the device is waited for (its event synchronised) before
    anything reads it, once, and the staging buffers are released then."""
    from attnaudit import _arrays

    class Event:
        synchronized = 0

        def synchronize(self):
            Event.synchronized += 1

    event = Event()
    snap = attnaudit.Snapshot.from_paged_kv(
        np.ones((1, 2, 8), np.float32), np.ones((2, 2, 4, 1, 8), np.float32), None,
        [[0]], [3])
    pending = _arrays._Pending(event, keepalive=["staging"])
    q = snap.wire_tensor("q")
    q._pending = pending
    assert Event.synchronized == 0
    data = snap.serialize()
    assert Event.synchronized == 1 and pending.keepalive is None
    snap.serialize()
    assert Event.synchronized == 1
    assert attnaudit.Snapshot.from_proto(snap.to_proto()).serialize() == data


# ---------------------------------------------------------------------------
# vLLM's CPU cache layout and the engine declarations
# ---------------------------------------------------------------------------


def _vllm_cpu_cache(nb=6, hkv=2, bs=16, D=8, seed=4):
    """A [nb, Hkv, 2*bs, D] cache as vLLM's CPU backend lays it out: per
    (block, KV head) K transposed ([D, bs] row-major), then V [bs, D]; and
    the logical K and V it holds."""
    rng = np.random.default_rng(seed)
    k = rng.standard_normal((nb, hkv, bs, D)).astype(np.float32)
    v = rng.standard_normal((nb, hkv, bs, D)).astype(np.float32)
    raw = np.concatenate([k.transpose(0, 1, 3, 2).reshape(nb, hkv, bs * D),
                          v.reshape(nb, hkv, bs * D)], axis=2)
    return raw.reshape(nb, hkv, 2 * bs, D), k, v


def test_vllm_cpu_layout_reads_the_transposed_keys():
    cache, k, v = _vllm_cpu_cache()
    q = np.zeros((2, 4, 8), dtype=np.float32)
    table, lens = [[3, 1], [5, 0]], [20, 17]
    snap = attnaudit.Snapshot.from_paged_kv(q, cache, None, table, lens,
                                            layout="vllm_cpu")
    assert snap.meta.kv_layout == snapshot_pb2.KV_LAYOUT_HND
    ids = list(snap.tensor("page_ids"))
    assert ids == [0, 1, 3, 5]
    np.testing.assert_array_equal(snap.tensor("k_pages"), k[ids])
    np.testing.assert_array_equal(snap.tensor("v_pages"), v[ids])
    # As the backend allocates it, [nb, Hkv, bs, 2D]: the same memory.
    alloc = cache.reshape(6, 2, 16, 16)
    same = attnaudit.Snapshot.from_paged_kv(q, alloc, None, table, lens,
                                            layout="vllm_cpu")
    np.testing.assert_array_equal(same.tensor("k_pages"), k[ids])
    # The key/value halves the backend slices from it.
    halves = attnaudit.Snapshot.from_paged_kv(q, cache[:, :, :16], cache[:, :, 16:],
                                              table, lens, layout="vllm_cpu")
    np.testing.assert_array_equal(halves.tensor("k_pages"), k[ids])
    np.testing.assert_array_equal(halves.tensor("v_pages"), v[ids])


def test_engine_presets_declare_precision_and_cast_point():
    cache, _, _ = _vllm_cpu_cache()
    q = np.zeros((1, 4, 8), dtype=np.float32)
    pb = snapshot_pb2
    snap = attnaudit.Snapshot.from_paged_kv(q, cache, None, [[2]], [9],
                                            layout="vllm_cpu", engine="vllm-cpu")
    assert snap.meta.precision.profile == pb.ENGINE_PROFILE_VLLM_CPU
    assert snap.meta.rope.cast_point == pb.ROPE_CAST_POINT_COS_SIN
    assert snap.labels.engine == "vllm-cpu"
    eager = attnaudit.Snapshot.from_paged_kv(
        q, cache, None, [[2]], [9], layout="vllm_cpu", engine="hf-eager",
        precision={"profile": "custom", "score_dtype": "bf16", "exp_ulps": 3},
        rope={"theta": 10000, "cast_point": "after_rope",
              "scaling": {"rope_type": "yarn", "factor": 4.0, "truncate": False}})
    assert eager.meta.precision.profile == pb.ENGINE_PROFILE_CUSTOM
    assert eager.meta.precision.score_dtype == tensor_pb2.DTYPE_BF16
    assert eager.meta.precision.exp_ulps == 3
    assert eager.meta.rope.cast_point == pb.ROPE_CAST_POINT_AFTER_ROPE  # explicit wins
    assert eager.meta.rope.scaling.no_truncate
    for bad, what in ((dict(engine="sglang-gpu"), "engine"),
                      (dict(precision={"profile": "hf_eager", "bogus": 1}), "precision"),
                      (dict(rope_table={"positions": [1]}), "rope_table")):
        with pytest.raises((ValueError, TypeError), match=what):
            attnaudit.Snapshot.from_paged_kv(q, cache, None, [[2]], [9],
                                             layout="vllm_cpu", **bad)


def test_hf_family_presets_take_the_family_cast_point():
    cache, _, _ = _vllm_cpu_cache()
    q = np.zeros((1, 4, 8), dtype=np.float32)
    pb = snapshot_pb2

    def cast_point(engine):
        snap = attnaudit.Snapshot.from_paged_kv(q, cache, None, [[2]], [9],
                                                layout="vllm_cpu", engine=engine)
        assert snap.meta.precision.profile in (pb.ENGINE_PROFILE_HF_EAGER,
                                               pb.ENGINE_PROFILE_TORCH_FLASH_CPU)
        return snap.meta.rope.cast_point

    assert cast_point("hf-eager/cohere") == pb.ROPE_CAST_POINT_COS_SIN
    assert cast_point("hf-sdpa/olmo2") == pb.ROPE_CAST_POINT_AFTER_ROPE
    assert cast_point("hf-eager/llama") == pb.ROPE_CAST_POINT_EACH_OP
    assert cast_point("hf-eager/some_new_family") == pb.ROPE_CAST_POINT_EACH_OP
    with pytest.raises(ValueError, match="engine"):
        attnaudit.Snapshot.from_paged_kv(q, cache, None, [[2]], [9],
                                         layout="vllm_cpu", engine="vllm-cpu/cohere")


def test_rope_inputs_travel_to_the_wire():
    cache, _, _ = _vllm_cpu_cache()
    q = np.zeros((1, 4, 8), dtype=np.float32)
    snap = attnaudit.Snapshot.from_paged_kv(
        q, cache, None, [[2]], [9], layout="vllm_cpu",
        rope_table={"inv_freq": np.ones(4, np.float32), "positions": [8],
                    "cos": np.ones((1, 4), np.float32),
                    "sin": np.zeros((1, 4), np.float32)},
        pre_rope_q=q, pre_rope_k=np.zeros((1, 2, 8), np.float32))
    paths = snap.tensor_paths()
    for p in ("pre_rope.q", "pre_rope.k", "rope_table.inv_freq",
              "rope_table.positions", "rope_table.cos", "rope_table.sin"):
        assert p in paths
    assert snap.tensor("pre_rope.k").shape == (1, 1, 2, 8)
    back = attnaudit.Snapshot.from_proto(snap.to_proto())
    np.testing.assert_array_equal(back.tensor("rope_table.inv_freq"), np.ones(4))


def test_pages_of_a_strided_pool_are_gathered_without_copying_the_pool():
    # One half of a fused K/V cache is a strided view of a big pool; the
    # gather must copy the pages it takes, not the pool (np.take would).
    import tracemalloc
    import ml_dtypes
    from attnaudit import _arrays
    pool = np.zeros((4096, 2, 64, 64), dtype=ml_dtypes.bfloat16)  # 64 MiB, fused
    half = pool[:, :, :32]                                         # strided K half
    tracemalloc.start()
    try:
        wt = _arrays.CopyPlan().take_pages(half, np.array([3, 4000]), "k_cache")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert tuple(wt.shape) == (2, 2, 32, 64)
    assert peak < 1 << 20, f"the gather allocated {peak} bytes"


# Every RoPE scaling type on the wire, with YaRN both truncating and not:
# the Python digest of the prefix (which binds the K RoPE identity) must be
# the server's, or the audit is refused at snapshot.prefix.fingerprint. A
# type added to the proto without its codec, its table or its fingerprint
# text in both languages fails here (docs/EXTENDING.md, "A RoPE variant").
_SCALING_CASES = [(t, False) for t in snapshot_pb2.RopeScalingType.values()] + [
    (snapshot_pb2.ROPE_SCALING_TYPE_YARN, True)]


@pytest.mark.parametrize("scaling_type, no_truncate", _SCALING_CASES)
def test_every_rope_scaling_type_fingerprints_as_the_server_does(
        scaling_type, no_truncate, client, cli, tmp_path):
    path = cli.synth(str(tmp_path / "r.pb"), "--preset", "qwen3-8b", "--context", "40",
                     "--prefix", "20")
    snap = attnaudit.Snapshot.load(path)
    scaling = snap.meta.rope.scaling
    scaling.Clear()
    scaling.type = scaling_type
    if scaling_type != snapshot_pb2.ROPE_SCALING_TYPE_NONE:
        scaling.factor = 4.0
        scaling.original_max_position = 4096
    scaling.no_truncate = no_truncate
    # Dynamic NTK and LongRoPE read a sequence length, LongRoPE its factor
    # lists (rotary_dim / 2 = 64 each); the other types ignore them.
    scaling.sequence_length = 8192
    scaling.short_factor.extend(1.0 + 0.01 * i for i in range(64))
    scaling.long_factor.extend(1.0 + 0.5 * i for i in range(64))
    snap.meta.prefix.fingerprint = fingerprint.prefix_fingerprint(
        snap, snap.meta.prefix.length, snap.meta.prefix.key)
    report = client.audit(snap)
    assert report.provenance.prefix_fingerprint == snap.meta.prefix.fingerprint
    # The type is bound: the same snapshot without scaling hashes otherwise.
    if scaling_type != snapshot_pb2.ROPE_SCALING_TYPE_NONE:
        scaling.Clear()
        assert fingerprint.prefix_fingerprint(
            snap, snap.meta.prefix.length,
            snap.meta.prefix.key) != report.provenance.prefix_fingerprint


@pytest.mark.parametrize("cast_point", ["after_rope", "cos_sin", "each_op"])
def test_the_prefix_fingerprint_binds_the_cast_point_as_the_server_does(
        cast_point, client, cli, tmp_path):
    path = cli.synth(str(tmp_path / "c.pb"), "--preset", "qwen3-8b", "--context", "40",
                     "--prefix", "20")
    snap = attnaudit.Snapshot.load(path)
    snap.meta.rope.cast_point = attnaudit.snapshot.rope_config(
        {"cast_point": cast_point}).cast_point
    snap.meta.prefix.fingerprint = fingerprint.prefix_fingerprint(
        snap, snap.meta.prefix.length, snap.meta.prefix.key)
    report = client.audit(snap)
    assert report.provenance.prefix_fingerprint == snap.meta.prefix.fingerprint


# Phi-3.5-mini's rope_parameters as transformers holds them (factors cut to
# four: the builder does not check their count, the server does).
_PHI3 = {"rope_type": "longrope", "rope_theta": 10000.0,
         "original_max_position_embeddings": 4096,
         "short_factor": [1.0, 1.02, 1.05, 1.1], "long_factor": [1.08, 2.5, 14.0, 60.0]}


def test_rope_config_translates_longrope():
    pb = snapshot_pb2
    rope = attnaudit.snapshot.rope_config({"theta": 10000, "scaling": {
        **_PHI3, "max_position_embeddings": 131072, "sequence_length": 30001}})
    s = rope.scaling
    assert s.type == pb.ROPE_SCALING_TYPE_LONGROPE
    assert list(s.short_factor) == _PHI3["short_factor"]
    assert list(s.long_factor) == _PHI3["long_factor"]
    assert s.original_max_position == 4096 and s.sequence_length == 30001
    assert s.factor == 32.0          # HF: max_position_embeddings / original
    assert s.attention_factor == 0   # the default, from factor
    # The legacy name, an explicit factor, and vLLM's mscale of the set in use.
    legacy = dict(_PHI3, rope_type="su", factor=16.0, short_mscale=1.1,
                  long_mscale=1.3, sequence_length=4096)
    s = attnaudit.snapshot.rope_config({"scaling": legacy}).scaling
    assert s.type == pb.ROPE_SCALING_TYPE_LONGROPE
    assert s.factor == 16.0 and s.attention_factor == 1.1  # short: 4096 <= 4096
    s = attnaudit.snapshot.rope_config(
        {"scaling": dict(legacy, sequence_length=4097)}).scaling
    assert s.attention_factor == 1.3
    # What cannot be guessed is asked for, naming the field.
    for missing, field in (("sequence_length", "rope.scaling.sequence_length"),
                           ("long_factor", "rope.scaling.long_factor"),
                           ("original_max_position_embeddings",
                            "rope.scaling.original_max_position")):
        bad = dict(_PHI3, factor=32.0, sequence_length=100)
        del bad[missing]
        with pytest.raises(ValueError, match=field):
            attnaudit.snapshot.rope_config({"scaling": bad})
    with pytest.raises(ValueError, match="rope.scaling.factor"):
        attnaudit.snapshot.rope_config({"scaling": dict(_PHI3, sequence_length=100)})


def test_rope_config_translates_dynamic_ntk():
    pb = snapshot_pb2
    hf = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}
    s = attnaudit.snapshot.rope_config({"scaling": {
        **hf, "max_position_embeddings": 4096, "sequence_length": 5000}}).scaling
    assert s.type == pb.ROPE_SCALING_TYPE_DYNAMIC
    assert (s.factor, s.original_max_position, s.sequence_length) == (2.0, 4096, 5000)
    # vLLM: L is max_trained_positions, S the model's max_position_embeddings.
    s = attnaudit.snapshot.rope_config({"scaling": {
        **hf, "max_trained_positions": 2048, "max_position_embeddings": 4096,
        "sequence_length": 4096}}).scaling
    assert (s.original_max_position, s.sequence_length) == (2048, 4096)
    with pytest.raises(ValueError, match="rope.scaling.original_max_position"):
        attnaudit.snapshot.rope_config({"scaling": dict(hf, sequence_length=5000)})
    with pytest.raises(ValueError, match="rope.scaling.sequence_length"):
        attnaudit.snapshot.rope_config(
            {"scaling": dict(hf, max_position_embeddings=4096)})
