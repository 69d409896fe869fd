"""The vLLM plugin without vLLM: settings, row choice, the step state
machine and snapshots built from backend-shaped tensors (numpy stand-ins
for vLLM's), audited by a real attnaudit-server.

The engine here is a numpy paged decode attention over vLLM's logical
cache layout [num_blocks, Hkv, block, 2 D] (K = cache[..., :D], V =
cache[..., D:], the FlashAttention/FlashInfer reading); the end-to-end run
on vLLM's own CPU engine is tests/vllm_plugin/e2e.py (`make vllm-plugin`).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import types

import ml_dtypes
import numpy as np
import pytest

from attnaudit import Verdict
from attnaudit.vllm import capture, expected, settings as S
from attnaudit.v1 import snapshot_pb2
from attnaudit.vllm.plugin import VllmAuditPlugin, layer_index

D, HQ, HKV, BLOCK = 32, 4, 2, 16


# ----------------------------------------------------------------------
# Settings
# ----------------------------------------------------------------------


def test_inactive_without_a_server():
    s = S.load({})
    assert not s.active
    assert S.load({"ATTNAUDIT_VLLM_SERVER": "h:1", "ATTNAUDIT_VLLM_ENABLE": "0"}).active is False
    assert S.load({"ATTNAUDIT_VLLM_SERVER": "h:1"}).active


def test_settings_from_the_environment():
    s = S.load({"ATTNAUDIT_VLLM_SERVER": "a:1", "ATTNAUDIT_VLLM_LAYERS": "0, 15,31",
                "ATTNAUDIT_VLLM_ROTATE_LAYERS": "false", "ATTNAUDIT_VLLM_SAMPLE_RATE": "0.25",
                "ATTNAUDIT_VLLM_REQUEST_FILTER": "^rl-", "ATTNAUDIT_VLLM_ON_STEP": "a.b:c, d:e"})
    assert s.layers == (0, 15, 31) and not s.rotate_layers
    assert s.sample_rate == 0.25 and s.request_filter == "^rl-"
    assert s.on_step == ("a.b:c", "d:e")
    assert S.load({"ATTNAUDIT_VLLM_LAYERS": "all"}).layers is None


@pytest.mark.parametrize("name,value", [
    ("SAMPLE_EVERY", "0"), ("SAMPLE_EVERY", "x"), ("SAMPLE_RATE", "1.5"),
    ("LAYERS", "-1"), ("ROTATE_LAYERS", "maybe"), ("MODE", "fast"),
    ("REQUEST_FILTER", "("), ("ON_STEP", "no_colon"), ("MAX_ROWS", "0"),
])
def test_bad_settings_name_the_setting(name, value):
    with pytest.raises(S.SettingsError, match=name.lower()):
        S.load({"ATTNAUDIT_VLLM_" + name: value})


def test_a_misspelt_setting_is_refused_with_the_nearest_name():
    with pytest.raises(S.SettingsError, match="did you mean ATTNAUDIT_VLLM_SAMPLE_EVERY"):
        S.load({"ATTNAUDIT_VLLM_SAMPLE_EVRY": "10"})
    with pytest.raises(S.SettingsError, match="did you mean max_rows"):
        S.from_mapping({"max_row": "4"})
    assert S.load({"ATTNAUDIT_VLLM_TOKEN_FILE": "", "ATTNAUDIT_VLLM_CONFIG": ""}).max_rows == 8


def test_config_file_and_environment_override(tmp_path):
    toml = tmp_path / "audit.toml"
    toml.write_text('server = "f:1"\nlayers = [1, 2]\nsample_every = 7\n')
    env = {"ATTNAUDIT_VLLM_CONFIG": str(toml), "ATTNAUDIT_VLLM_SAMPLE_EVERY": "9"}
    s = S.load(env)
    assert (s.server, s.layers, s.sample_every) == ("f:1", (1, 2), 9)
    js = tmp_path / "audit.json"
    js.write_text(json.dumps({"server": "j:1", "bogus": 1}))
    with pytest.raises(S.SettingsError, match="bogus"):
        S.load({"ATTNAUDIT_VLLM_CONFIG": str(js)})
    token = tmp_path / "token"
    token.write_text("sekret\n")
    assert S.load({"ATTNAUDIT_VLLM_TOKEN_FILE": str(token)}).token == "sekret"
    with pytest.raises(S.SettingsError, match="token_file"):
        S.load({"ATTNAUDIT_VLLM_TOKEN_FILE": str(tmp_path / "missing")})


def test_register_without_settings_touches_nothing():
    # A fresh interpreter: vLLM calls register() in every process; without
    # a server it must neither wrap nor import vLLM (absent here anyway).
    code = ("import sys, attnaudit.vllm as v; v.register(); "
            "assert v.plugin() is None; "
            "assert 'attnaudit.vllm.seams' not in sys.modules; print('ok')")
    env = {"PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


# ----------------------------------------------------------------------
# Rows, steps, requests
# ----------------------------------------------------------------------


def test_decode_rows_skip_prefill_chunks():
    # Rows: decode, prefill chunk of 5, decode, decode; padding after.
    starts = np.array([0, 1, 6, 7, 8, 8], dtype=np.int32)
    assert capture.decode_rows(starts, 4) == ([0, 2, 3], [0, 6, 7])


def test_row_choice_by_request():
    rows = [0, 2, 3]
    ids = ["rl-a", "x", "y", "rl-c"]   # rows 0 and 3 match
    assert capture.choose_rows(rows, ids, pattern="^rl-", fraction=None, seed=0,
                               max_rows=8) == [0, 2]
    assert capture.choose_rows(rows, ids, pattern=None, fraction=None, seed=0,
                               max_rows=2) == [0, 1]
    # Without ids nothing can be chosen by id.
    assert capture.choose_rows(rows, None, pattern="^rl-", fraction=None, seed=0,
                               max_rows=8) == []
    # A fraction keeps about that share of ids, the same ones every time.
    many = [f"req-{i}" for i in range(2000)]
    kept = capture.choose_rows(list(range(2000)), many, pattern=None, fraction=0.1,
                               seed=3, max_rows=10**6)
    assert 150 < len(kept) < 250
    assert kept == capture.choose_rows(list(range(2000)), many, pattern=None,
                                       fraction=0.1, seed=3, max_rows=10**6)


def test_step_choice():
    assert [s for s in range(10) if capture.step_chosen(s, 4, None)] == [0, 4, 8]
    picks = [capture.step_chosen(s, 1, 0.2, seed=1) for s in range(5000)]
    assert 800 < sum(picks) < 1200
    assert picks == [capture.step_chosen(s, 1, 0.2, seed=1) for s in range(5000)]


def test_layer_index_and_rope_declaration():
    assert layer_index("model.layers.12.self_attn.attn") == 12
    assert layer_index("lm_head") is None
    plain = capture.rope_declaration(theta=1e4, rotary_dim=64, neox=True,
                                     rope_parameters={"rope_type": "default",
                                                      "rope_theta": 1e4})
    assert "scaling" not in plain and plain["style"] == "neox"
    llama3 = capture.rope_declaration(
        theta=5e5, rotary_dim=128, neox=True,
        rope_parameters={"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0,
                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192})
    assert llama3["scaling"] == {"rope_type": "llama3", "factor": 8.0,
                                 "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                 "original_max_position_embeddings": 8192}


# ----------------------------------------------------------------------
# The step state machine against a real server
# ----------------------------------------------------------------------


class Engine:
    """A paged decode batch in vLLM's logical cache layout, and its
    attention computed the way a correct kernel would (f32, bf16 out)."""

    def __init__(self, lens=(37, 20), seed=0, extra_blocks=3):
        g = np.random.default_rng(seed)
        self.lens = list(lens)
        blocks = [(n + BLOCK - 1) // BLOCK for n in lens]
        nb = sum(blocks) + extra_blocks
        self.cache = g.standard_normal((nb, HKV, BLOCK, 2 * D)).astype(ml_dtypes.bfloat16)
        ids = g.permutation(nb)
        self.table = np.zeros((len(lens), max(blocks) + 1), dtype=np.int32)
        used = 0
        for b, n in enumerate(blocks):
            self.table[b, :n] = ids[used:used + n]
            used += n
        self.query = g.standard_normal((len(lens), HQ, D)).astype(ml_dtypes.bfloat16)
        self.starts = np.arange(len(lens) + 1, dtype=np.int32)
        self.scale = D ** -0.5

    def keys(self, b, table=None):
        table = self.table if table is None else table
        n = self.lens[b]
        pages = [self.cache[table[b, i // BLOCK], :, i % BLOCK] for i in range(n)]
        kv = np.stack(pages).astype(np.float32)        # [n, Hkv, 2D]
        return kv[..., :D], kv[..., D:]

    def attend(self, table=None):
        out = np.zeros((len(self.lens), HQ, D), dtype=np.float32)
        for b in range(len(self.lens)):
            k, v = self.keys(b, table)
            for h in range(HQ):
                kh = h // (HQ // HKV)
                s = (k[:, kh] @ self.query[b, h].astype(np.float32)) * self.scale
                p = np.exp(s - s.max())
                out[b, h] = (p / p.sum()) @ v[:, kh]
        return out.astype(ml_dtypes.bfloat16).reshape(len(self.lens), HQ * D)

    def call(self, layer, output):
        return capture.AttentionCall(
            backend="flash_attn", layer=layer, query=self.query, kv_cache=self.cache,
            block_table=self.table, seq_lens=np.array(self.lens, dtype=np.int32),
            query_start_loc=self.starts, output=output, scale=self.scale)


class Metadata:
    def __init__(self, e: Engine):
        self.seq_lens = np.array(e.lens, dtype=np.int32)
        self.query_start_loc = e.starts
        # The cache slot each row's decode token is written to.
        self.slot_mapping = np.array(
            [e.table[b, (n - 1) // BLOCK] * BLOCK + (n - 1) % BLOCK
             for b, n in enumerate(e.lens)], dtype=np.int64)


def run_steps(plugin, engine, steps, layers=(0, 1, 2), outputs=None):
    touched = []
    for _ in range(steps):
        ctx = types.SimpleNamespace()

        def md():
            touched.append(1)
            return Metadata(engine)
        names = [f"model.layers.{i}.self_attn.attn" for i in layers]
        for layer in layers:
            st = plugin.state(ctx, md, lambda names=names: names, lambda: ["r0", "r1"])
            out = engine.attend() if outputs is None else outputs(layer)
            plugin.on_attention(st, engine.call(layer, out))
    return touched


def make_plugin(server, **overrides):
    values = {"server": server.address, "sample_every": "2", "rope_check": "0",
              "log_summary": "0", "max_in_flight": "8"}
    values.update(overrides)
    return VllmAuditPlugin(S.from_mapping(values))


def test_the_configuration_implies_the_softmax_scale():
    ns = types.SimpleNamespace
    scale = expected.config_softmax_scale
    assert scale(ns(head_dim=128)) == 128 ** -0.5
    assert scale(ns(hidden_size=4096, num_attention_heads=32)) == 128 ** -0.5
    assert scale(ns(head_dim=128, query_pre_attn_scalar=144)) == 144 ** -0.5
    assert scale(ns(head_dim=128, attention_multiplier=0.0078125)) == 0.0078125
    assert scale(ns(head_dim=192, kv_lora_rank=512)) is None
    assert scale(ns()) is None


def gemma2_like():
    return types.SimpleNamespace(
        model_type="gemma2", head_dim=D, num_attention_heads=HQ, query_pre_attn_scalar=D,
        attn_logit_softcapping=50.0, sliding_window=16,
        layer_types=["sliding_attention", "full_attention"])


def test_the_configuration_fixes_cap_window_sinks_and_sizes():
    want = expected.Expected.from_config(gemma2_like())
    right = dict(scale=D ** -0.5, soft_cap=50.0, has_sinks=False, head_dim=D, num_heads=HQ)
    assert want.mismatches(0, window=16, **right) == []
    assert want.mismatches(1, window=-1, **right) == []   # vLLM's "no window"
    assert want.mismatches(1, window=None, **dict(right, num_heads=HQ // 2)) == []  # TP 2
    found = want.mismatches(0, window=None, **dict(right, soft_cap=None))
    assert found == ["soft-cap none, the configuration's 50",
                     "window none, the configuration's 16"], found
    found = want.mismatches(1, window=16, **dict(right, head_dim=D // 2, num_heads=3))
    assert [f.split(" ")[0] for f in found] == ["window", "head", "3"], found
    # GPT-OSS always has sinks; a configuration that does not say is not checked.
    oss = expected.Expected.from_config(types.SimpleNamespace(model_type="gpt_oss", head_dim=D))
    assert oss.mismatches(0, **dict(right, soft_cap=None), window=None) == [
        "no sinks, the configuration's architecture has them"]
    plain = expected.Expected.from_config(types.SimpleNamespace(head_dim=D))
    assert plain.mismatches(5, scale=D ** -0.5, soft_cap=30.0, window=4096, has_sinks=True,
                            head_dim=D, num_heads=HQ) == []


def test_a_layer_built_unlike_the_configuration_is_said(server, caplog):
    # The kernel runs (and the snapshot declares) x1.25 the configured scale
    # and no soft-cap: the audit cannot see it, the configuration can.
    plugin = make_plugin(server, sample_every="1", layers="0", log_summary="1")
    engine = Engine()
    plugin.expected = expected.Expected(scale=engine.scale, soft_cap=30.0)
    engine.scale *= 1.25
    summaries = []
    plugin.add_step_callback(summaries.append)
    with caplog.at_level("WARNING", logger="attnaudit.vllm"):
        run_steps(plugin, engine, steps=2, layers=(0,))
        assert plugin.flush(60)
    assert plugin.counters()["config_mismatch"] == 2
    said = [r.getMessage() for r in caplog.records if "runs attention with" in r.getMessage()]
    assert len(said) == 2 and all("layer 0" in m for m in said), said
    assert "softmax scale" in said[0] and "soft-cap none" in said[1]
    assert [len(s.config_findings) for s in summaries] == [2, 2]
    assert "unlike the model's configuration: layer 0 softmax scale" in summaries[0].line()
    plugin.close(10)


def test_the_training_loops_step_labels_the_snapshots(server, tmp_path):
    step_file = tmp_path / "rl_step"
    plugin = make_plugin(server, sample_every="1", layers="0",
                         step_file=str(step_file))
    summaries = []
    plugin.add_step_callback(summaries.append)
    engine = Engine()
    run_steps(plugin, engine, steps=1, layers=(0,))          # no file yet
    step_file.write_text("17 grpo-7\n")
    run_steps(plugin, engine, steps=1, layers=(0,))
    plugin.set_rl_step(18, weight_version="sync-3")
    run_steps(plugin, engine, steps=1, layers=(0,))
    assert plugin.flush(60)
    labels = sorted((r.step, r.report.proto.labels.step, r.report.proto.labels.run,
                     r.report.proto.labels.weight_version)
                    for r in plugin.auditor().results())
    # The weight version: unknown until the loop sets a step, then the step
    # unless it names one.
    assert labels == [(0, 0, "", ""), (1, 17, "grpo-7", "17"),
                      (2, 18, "grpo-7", "sync-3")], labels
    # Every snapshot is the rollout's side of a train-rollout pair.
    assert {r.report.proto.labels.role for r in plugin.auditor().results()} == \
        {snapshot_pb2.SNAPSHOT_ROLE_ROLLOUT}
    assert [s.rl_step for s in sorted(summaries, key=lambda s: s.step)] == [None, 17, 18]
    assert "(RL step 17)" in sorted(summaries, key=lambda s: s.step)[1].line()
    plugin.close(10)


def test_a_prefix_cached_under_older_weights_is_named(server, caplog):
    plugin = make_plugin(server, sample_every="1", layers="0")
    engine = Engine(lens=(70, 40))
    plugin.learn_cache(engine.cache, "cpu_attn")
    summaries = []
    plugin.add_step_callback(summaries.append)
    plugin.set_rl_step(1)           # the record starts: nothing is stale yet
    run_steps(plugin, engine, steps=1, layers=(0,))
    plugin.set_rl_step(2)           # new weights; the cache was not reset
    with caplog.at_level("WARNING", logger="attnaudit.vllm"):
        run_steps(plugin, engine, steps=1, layers=(0,))
    # The prefix recomputed under the new weights (a reset cache's prefill).
    for b, n in enumerate(engine.lens):
        plugin.prefix.stamp(np.array([engine.table[b, i // BLOCK] * BLOCK + i % BLOCK
                                      for i in range(n)]))
    run_steps(plugin, engine, steps=1, layers=(0,))
    assert plugin.flush(60)
    stale = [s.stale_prefix for s in sorted(summaries, key=lambda s: s.step)]
    # Row 0 fills 5 blocks of 16 (its last one written at this step), row 1 3.
    assert stale == [(), ("r0: 4 block(s) cached before weight version 2",
                          "r1: 2 block(s) cached before weight version 2"), ()], stale
    assert plugin.counters()["stale_prefix_rows"] == 2
    said = [r.getMessage() for r in caplog.records if "prefix cache not reset" in r.getMessage()]
    assert len(said) == 1, said
    plugin.close(10)


def test_a_hung_server_does_not_hold_the_exit():
    # A server that accepts the connection and never answers.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    address = f"127.0.0.1:{listener.getsockname()[1]}"
    try:
        plugin = make_plugin(types.SimpleNamespace(address=address), sample_every="1",
                             layers="0", timeout="60")
        run_steps(plugin, Engine(), steps=2, layers=(0,))
        t0 = time.monotonic()
        assert not plugin.close_at_exit(limit=30.0, stall=0.5)
        assert time.monotonic() - t0 < 10.0  # not the 60 s call deadline
    finally:
        listener.close()


def test_a_local_checkpoint_is_labelled_by_its_name():
    assert capture.model_label("/models/ckpt/Qwen3-8B/") == "Qwen3-8B"
    assert capture.model_label("./runs/step-400") == "step-400"
    assert capture.model_label("Qwen/Qwen3-8B") == "Qwen/Qwen3-8B"


def test_row_choice_rotates_over_the_batch():
    rows = list(range(16))
    for max_rows in (5, 8, 16):
        seen = set()
        steps = -(-16 // max_rows)
        for k in range(steps):
            chosen = capture.choose_rows(rows, None, pattern=None, fraction=None, seed=0,
                                         max_rows=max_rows, offset=k * max_rows)
            assert len(chosen) == max_rows
            seen.update(chosen)
        assert seen == set(rows), max_rows
    # The filters choose which rows may be audited; the rotation runs over those.
    ids = [f"keep-{i}" if i % 2 else f"skip-{i}" for i in rows]
    chosen = capture.choose_rows(rows, ids, pattern="keep", fraction=None, seed=0,
                                 max_rows=3, offset=3)
    assert chosen == [7, 9, 11]


def test_a_stale_page_past_max_rows_is_audited_on_a_later_step(server):
    # Row 12 of 16 reads row 0's first page; max_rows 8 audits rows 0-7,
    # then 8-15.
    plugin = make_plugin(server, rotate_layers="0", layers="0", max_rows="8",
                         sample_every="1")
    engine = Engine(lens=tuple(20 + i for i in range(16)))
    stale = engine.table.copy()
    stale[12, 0] = engine.table[0, 0]
    run_steps(plugin, engine, steps=2, layers=(0,), outputs=lambda layer: engine.attend(stale))
    assert plugin.flush(60)
    results = sorted(plugin.auditor().results(), key=lambda r: r.step)
    assert [r.verdict for r in results] == [Verdict.PASS, Verdict.DRIFT], \
        [r.error for r in results]
    c = plugin.counters()
    assert c["decode_rows_seen"] == 32 and c["decode_rows_chosen"] == 16
    plugin.close(10)


def test_a_rope_model_whose_rotary_op_is_unseen_is_counted_unchecked(server, caplog):
    # Compiled execution: the rotary seam never runs, so no pre-RoPE rows.
    plugin = make_plugin(server, rope_check="1", sample_every="1", layers="0")
    plugin.rope_parameters = {"rope_type": "default", "rope_theta": 1e4}
    engine = Engine()
    with caplog.at_level("WARNING", logger="attnaudit.vllm"):
        run_steps(plugin, engine, steps=2, layers=(0,))
    assert plugin.flush(60)
    assert plugin.counters()["rope_missed"] == 2
    assert sum("RoPE unchecked" in r.getMessage() for r in caplog.records) == 1
    plugin.close(10)


def test_sampled_steps_audit_the_chosen_layers(server):
    plugin = make_plugin(server, rotate_layers="1")
    summaries = []
    plugin.add_step_callback(summaries.append)
    engine = Engine()
    touched = run_steps(plugin, engine, steps=6)
    assert len(touched) == 6  # the metadata is read once per step
    assert plugin.flush(60)
    results = plugin.auditor().results()
    # Steps 0, 2, 4 sampled; one layer each, in turn.
    assert [(r.step, r.layer) for r in sorted(results, key=lambda r: r.step)] == \
        [(0, 0), (2, 1), (4, 2)]
    assert all(r.verdict == Verdict.PASS for r in results), [r.error for r in results]
    assert [s.step for s in sorted(summaries, key=lambda s: s.step)] == [0, 2, 4]
    assert all(s.passed == 1 and s.drifted == 0 for s in summaries)
    assert all(s.request_ids == ("r0", "r1") for s in summaries)
    assert all(0 <= s.worst_share < 1 for s in summaries)
    report = results[0].report
    assert list(report.proto.labels.request_ids) == ["r0", "r1"]
    assert report.proto.labels.engine == "vllm"
    c = plugin.counters()
    assert c["steps"] == 6 and c["sampled_steps"] == 3 and c["plugin_errors"] == 0
    plugin.close(10)


def test_a_wrong_page_drifts_and_the_summary_names_it(server):
    plugin = make_plugin(server, rotate_layers="0", layers="1")
    summaries = []
    plugin.add_step_callback(summaries.append)
    engine = Engine()
    stale = engine.table.copy()
    stale[1, 0] = engine.table[0, 0]  # row 1 reads row 0's first page
    run_steps(plugin, engine, steps=1,
              outputs=lambda layer: engine.attend(stale if layer == 1 else None))
    assert plugin.flush(60)
    (summary,) = summaries
    assert summary.layers == (1,) and summary.drifted == 1 and summary.worst_layer == 1
    assert summary.worst_share > 1
    assert summary.top_diagnosis in ("foreign-page", "stale-page"), summary
    assert summary.as_dict()["attnaudit/drifted"] == 1
    (result,) = plugin.auditor().results()
    assert result.report.diagnosis.row == 1
    assert result.report.diagnosis.page == int(engine.table[1, 0])
    plugin.close(10)


def test_requests_outside_the_filter_are_not_audited(server):
    plugin = make_plugin(server, request_filter="^r1$")
    engine = Engine()
    run_steps(plugin, engine, steps=1, layers=(0,))
    assert plugin.flush(60)
    (result,) = plugin.auditor().results()
    assert list(result.report.proto.labels.request_ids) == ["r1"]
    assert result.verdict == Verdict.PASS
    nobody = make_plugin(server, request_filter="^zzz$")
    run_steps(nobody, engine, steps=2, layers=(0,))
    assert nobody.counters()["sampled_steps"] == 0 and nobody._auditor is None


def test_snapshots_are_bounded_in_bytes(server):
    # Pages here are 2 x 16 x 64 bf16 = 4 KiB: row 0 holds 3 (12 KiB),
    # row 1 holds 2 (8 KiB).
    engine = Engine()
    one_row = make_plugin(server, max_snapshot_mb=str(15 / 1024))
    run_steps(one_row, engine, steps=1, layers=(0,))
    assert one_row.flush(60)
    (result,) = one_row.auditor().results()
    assert list(result.report.proto.labels.request_ids) == ["r0"]
    assert result.verdict == Verdict.PASS
    none = make_plugin(server, max_snapshot_mb=str(10 / 1024))
    run_steps(none, engine, steps=1, layers=(0,))
    assert none.counters()["too_large"] == 1 and none._auditor is None
    one_row.close(10)


def test_pre_rope_rows_travel_with_their_layer(server):
    # With the rolling check on, the rows copied before RoPE go to the next
    # attention call, and only to it.
    plugin = make_plugin(server, rope_check="1", sample_every="1")
    engine = Engine()
    ctx = types.SimpleNamespace()
    st = plugin.state(ctx, lambda: Metadata(engine), lambda: ["l.0.attn"], lambda: None)
    q = np.arange(2 * HQ * D, dtype=np.float32).reshape(2, HQ * D)
    k = np.arange(2 * HKV * D, dtype=np.float32).reshape(2, HKV * D)
    plugin.on_rotary(st, {"theta": 1e4, "rotary_dim": D, "neox": True}, q, k,
                     module=_Rotary())
    assert st.pending is not None and st.pending.tokens == (0, 1)
    assert st.inv_freq is not None and st.inv_freq.shape == (D // 2,)
    q[:] = -1  # RoPE rotating in place must not reach the copy
    assert float(st.pending.q[0, 0]) == 0.0
    plugin.on_attention(st, engine.call(7, engine.attend()))  # layer 7 not chosen
    assert st.pending is None
    plugin.close(10)


class _Rotary:
    """vLLM's rotary module as engine_inv_freq sees it: the cos/sin cache
    built by the class that computes the inverse frequencies."""
    base = 1e4
    rotary_dim = D

    def _compute_inv_freq(self, base):
        return 1.0 / base ** (np.arange(0, self.rotary_dim, 2) / self.rotary_dim)

    def _compute_cos_sin_cache(self):
        return None


class _Llama3(_Rotary):  # reshapes inv_freq; the base class builds the cache
    def _compute_inv_freq(self, base):
        return super()._compute_inv_freq(base) / 8


class _Linear(_Rotary):  # divides positions: inv_freq is not the whole story
    def _compute_cos_sin_cache(self):
        return None


def test_the_rotary_modules_own_inverse_frequencies_are_the_rope_table():
    want = 1.0 / 1e4 ** (np.arange(0, D, 2) / D)
    np.testing.assert_allclose(capture.engine_inv_freq(_Rotary(), D), want, rtol=1e-7)
    np.testing.assert_allclose(capture.engine_inv_freq(_Llama3(), D), want / 8, rtol=1e-7)
    assert capture.engine_inv_freq(_Linear(), D) is None
    assert capture.engine_inv_freq(_Rotary(), D // 2) is None   # not this width
    assert capture.engine_inv_freq(object(), D) is None
    engine = Engine()
    call = engine.call(0, engine.attend())
    rope = capture.rope_declaration(theta=1e4, rotary_dim=D, neox=True, rope_parameters=None)
    snap = capture.build_snapshot(call, rows=[0, 1], tokens=[0, 1], engine=None, rope=rope,
                                  pre_rope=None, labels={},
                                  inv_freq=capture.engine_inv_freq(_Rotary(), D))
    assert "rope_table.inv_freq" in snap.tensor_paths()
    np.testing.assert_allclose(snap.tensor("rope_table.inv_freq"), want, rtol=1e-7)


def test_engine_side_failures_are_counted_never_raised(server):
    plugin = make_plugin(server, sample_every="1")
    engine = Engine()
    ctx = types.SimpleNamespace()
    st = plugin.state(ctx, lambda: Metadata(engine), lambda: ["l.0.attn"], lambda: None)
    bad = engine.call(0, engine.attend())
    bad.kv_cache = engine.cache[..., :D]  # not [.., 2 D]: the builder refuses it
    plugin.on_attention(st, bad)
    assert plugin.flush(30)
    assert plugin.auditor().counters.failed == 1
    assert "2 x head dim" in str(plugin.auditor().last_error)
    plugin.close(10)


def test_a_server_that_is_down_is_named_once_in_the_log(caplog):
    # log_summary off: the step lines are silent, the reason is not.
    plugin = make_plugin(types.SimpleNamespace(address="127.0.0.1:1"),
                         sample_every="1", layers="0", timeout="10")
    with caplog.at_level("WARNING", logger="attnaudit.vllm"):
        run_steps(plugin, Engine(), steps=2, layers=(0,))
        assert plugin.flush(60)
    failed = [r.getMessage() for r in caplog.records if "audit of step" in r.getMessage()]
    assert len(failed) == 1, failed
    assert "Unavailable" in failed[0] or "UNAVAILABLE" in failed[0], failed[0]
    assert plugin.auditor().counters.failed == 2
    plugin.close(5)


def test_rope_scaled_by_length_is_not_declared_and_the_audit_runs(server, caplog):
    plugin = make_plugin(server, sample_every="1", layers="0")
    plugin.rope_parameters = {"rope_type": "longrope", "short_factor": [1.0] * (D // 2),
                              "long_factor": [2.0] * (D // 2),
                              "original_max_position_embeddings": 4096}
    engine = Engine()
    with caplog.at_level("WARNING", logger="attnaudit.vllm"):
        for _ in range(2):
            ctx = types.SimpleNamespace()
            st = plugin.state(ctx, lambda: Metadata(engine), lambda: ["l.0.attn"],
                              lambda: None)
            plugin.on_rotary(st, {"theta": 1e4, "rotary_dim": D, "neox": True}, None, None)
            plugin.on_attention(st, engine.call(0, engine.attend()))
        assert plugin.flush(60)
    results = plugin.auditor().results()
    assert [r.verdict for r in results] == [Verdict.PASS] * 2, [r.error for r in results]
    said = [r.getMessage() for r in caplog.records if "scaled by sequence length" in r.getMessage()]
    assert len(said) == 1 and "longrope" in said[0]
    plugin.close(10)


def test_a_run_that_samples_no_step_says_so(server, caplog):
    # (A short run whose first steps are prefill meets the same: its first
    # sampled step with decode rows would come at sample_every.)
    plugin = make_plugin(server, sample_rate="0", layers="0")
    run_steps(plugin, Engine(), steps=3, layers=(0,))
    with caplog.at_level("WARNING", logger="attnaudit.vllm"):
        plugin.close(10)
    said = [r.getMessage() for r in caplog.records if "none sampled" in r.getMessage()]
    assert len(said) == 1 and "3 engine steps" in said[0], said


def test_warm_up_passes_are_not_steps(server):
    plugin = make_plugin(server)
    ctx = types.SimpleNamespace()
    assert plugin.state(ctx, lambda: None, list, lambda: None) is None
    assert plugin.state(ctx, lambda: 1 / 0, list, lambda: None) is None  # cached
    assert plugin.counters()["steps"] == 0


# ----------------------------------------------------------------------
# The measured precision (attnaudit.vllm.precision)
# ----------------------------------------------------------------------


class RecordingClient:
    """Keeps every snapshot the auditor sends; audits nothing."""

    def __init__(self):
        self.metas = []

    def audit(self, snapshot, **_):
        self.metas.append(snapshot.meta)
        raise RuntimeError("recorded, not audited")

    def close(self):
        pass


def synthetic_prober(calls):
    """A prober that runs the real probe on a numpy engine that truncates
    like vLLM's CPU kernels without AVX512_BF16."""
    from attnaudit import probe
    from attnaudit.probe import synthetic

    def run(key, rope_module):
        calls.append((key, rope_module))
        return probe.run(synthetic.engine(key.dtype, output="rtz", cast_point="cos_sin",
                                          head_dim=key.head_dim, heads=(4, 2), max_keys=1024,
                                          profile="flash_decoding"))
    return run


def recording_plugin(prober=None, **overrides):
    values = {"server": "127.0.0.1:1", "sample_every": "1", "rope_check": "0",
              "log_summary": "0", "max_in_flight": "8"}
    values.update(overrides)
    client = RecordingClient()
    return VllmAuditPlugin(S.from_mapping(values), client_factory=lambda: client,
                           prober=prober), client


@pytest.mark.filterwarnings("ignore:attnaudit.RolloutAuditor")
def test_snapshots_declare_the_measured_precision():
    calls = []
    plugin, client = recording_plugin(synthetic_prober(calls))
    engine = Engine()
    plugin.warm_up(capture.backend_key(engine.call(0, engine.attend())))  # start-up
    assert len(calls) == 1
    run_steps(plugin, engine, steps=3)
    assert plugin.flush(30)
    assert len(calls) == 1                      # once per process and backend
    assert len(client.metas) == 3             # one layer per sampled step
    for meta in client.metas:
        p = meta.precision
        assert p.source == snapshot_pb2.PRECISION_SOURCE_MEASURED
        assert p.output_rounding == snapshot_pb2.ROUNDING_TOWARD_ZERO
        assert p.profile == snapshot_pb2.ENGINE_PROFILE_FLASH_DECODING
        assert p.evidence.startswith("measured on ") and "truncation" in p.evidence
    assert plugin.declared(capture.backend_key(engine.call(0, engine.attend()))).measured
    plugin.close(5)


@pytest.mark.filterwarnings("ignore:attnaudit.RolloutAuditor")
def test_a_failed_probe_falls_back_to_the_preset_with_one_line(caplog):
    tries = []

    def broken(key, rope_module):
        tries.append(key)
        raise RuntimeError("no kernels here")

    plugin, client = recording_plugin(broken)
    engine = Engine()
    with caplog.at_level("WARNING", logger="attnaudit.vllm"):
        run_steps(plugin, engine, steps=2)
        assert plugin.flush(30)
    assert len(tries) == 1                      # not retried
    lines = [r.getMessage() for r in caplog.records if "engine probe failed" in r.getMessage()]
    assert len(lines) == 1 and "'vllm'" in lines[0] and "no kernels here" in lines[0]
    for meta in client.metas:
        assert meta.precision.source == snapshot_pb2.PRECISION_SOURCE_PRESET
        assert meta.precision.profile == snapshot_pb2.ENGINE_PROFILE_FLASH_DECODING
    plugin.close(5)


@pytest.mark.filterwarnings("ignore:attnaudit.RolloutAuditor")
def test_probe_off_declares_the_preset_and_never_probes():
    calls = []
    plugin, client = recording_plugin(synthetic_prober(calls), probe="0", engine="vllm-cpu")
    engine = Engine()
    run_steps(plugin, engine, steps=1, layers=(0,))
    assert plugin.flush(30)
    assert calls == [] and client.metas
    assert client.metas[0].precision.source == snapshot_pb2.PRECISION_SOURCE_PRESET
    assert client.metas[0].precision.profile == snapshot_pb2.ENGINE_PROFILE_VLLM_CPU
    plugin.close(5)


def test_the_measured_cast_point_joins_the_rope_declaration():
    engine = Engine()
    call = engine.call(0, engine.attend())
    rope = capture.rope_declaration(theta=1e4, rotary_dim=D, neox=True, rope_parameters=None)
    snap = capture.build_snapshot(call, rows=[0, 1], tokens=[0, 1], engine=None, rope=rope,
                                  pre_rope=None, labels={}, cast_point="cos_sin",
                                  precision={"profile": "flash_decoding",
                                             "rope_rounding": "truncate",
                                             "source": "measured", "evidence": "x"})
    assert snap.meta.rope.cast_point == snapshot_pb2.ROPE_CAST_POINT_COS_SIN
    assert snap.meta.precision.rope_rounding == snapshot_pb2.ROUNDING_TOWARD_ZERO
    key = capture.backend_key(call)
    assert (key.backend, key.dtype, key.head_dim) == ("flash_attn", "bf16", D)
