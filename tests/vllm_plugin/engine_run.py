"""One vLLM engine run with the attnaudit plugin as vLLM loads it.

usage: engine_run.py MODEL_DIR SCENARIO OUT_JSON

The plugin is configured through the environment only (the orchestrator,
e2e.py, sets ATTNAUDIT_VLLM_*), exactly as a vLLM user would. SCENARIO
injects an engine bug *below* the plugin's seam, so the kernel computes
with the bug while the plugin sees what the engine meant:

  clean                 nothing injected
  stale-page            the kernel reads row 1's first block from a page
                        an earlier, finished request left behind (a stale
                        block-table entry)
  wrong-scale           the kernel folds log2(e) into the softmax scale
                        but exponentiates with exp (an exp2 kernel's
                        scale in an exp kernel)
  rope-scaling-ignored  the engine's RoPE drops the model's llama3 scaling
  stale-prefix          the RL loop's weights change (layer 0's input norm
                        scaled by 1.25, weight version 1 -> 2) between two
                        generations of the same prompts, and vLLM's prefix
                        cache is not reset: the second reads prefix blocks
                        cached under the old weights
  layer-scale           every attention layer is built with 1.25x the
                        softmax scale the model's configuration implies
                        (the kernel computes what the layer declares: only
                        the configuration check can see it)

E2E_RL_STEP=N: before generating, the RL loop's step N is set in the
engine's process through vLLM's collective_rpc ("attnaudit_set_rl_step").

Writes the generated token ids and log-probs, the plugin's counters and
every audit outcome (verdict, diagnosis, page, row, RoPE checks) as JSON.
The engine runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0), on
vLLM's CPU backend.
"""

from __future__ import annotations

import copy
import json
import os
import sys
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

PROMPTS = [[1] + [5 + (7 * i) % 400 for i in range(40)],
           [1] + [9 + (11 * i) % 400 for i in range(70)],
           [1] + [3 + (13 * i) % 400 for i in range(23)]]


# Where the stale-page bug struck: row, logical block, the page the block
# table names and the page the kernel read instead.
INJECTED: dict = {}
# Pages the warm-up request wrote (the stale-page bug reads one of them).
WARM_PAGES: set = set()
WARMUP = [[1] + [200 + (3 * i) % 300 for i in range(95)]]


def inject(scenario: str) -> None:
    if scenario in ("clean", "stale-prefix"):
        return
    if scenario == "rope-scaling-ignored":
        from vllm.model_executor.layers.rotary_embedding import base, llama3_rope
        llama3_rope.Llama3RotaryEmbedding._compute_inv_freq = \
            base.RotaryEmbeddingBase._compute_inv_freq
        return
    from vllm.v1.attention.backends import cpu_attn
    impl = cpu_attn.CPUAttentionBackendImpl
    kernel = impl.forward
    if scenario == "layer-scale":
        build = impl.__init__

        def init(self, *args, **kwargs):
            build(self, *args, **kwargs)
            self.scale = float(self.scale) * 1.25
        impl.__init__ = init
        return

    if scenario == "wrong-scale":
        def forward(self, layer, query, key, value, kv_cache, md, *args, **kwargs):
            right = self.scale
            self.scale = right * 1.4426950408889634  # log2(e)
            try:
                return kernel(self, layer, query, key, value, kv_cache, md, *args, **kwargs)
            finally:
                self.scale = right
    elif scenario == "stale-page":
        def forward(self, layer, query, key, value, kv_cache, md, *args, **kwargs):
            if md is not None and len(md.seq_lens) == 1:   # the warm-up
                blocks = (int(md.seq_lens[0]) + 31) // 32
                WARM_PAGES.update(int(p) for p in md.block_table[0, :blocks])
            elif md is not None and md.max_query_len == 1 and len(md.seq_lens) >= 2:
                md = copy.copy(md)
                table = md.block_table.clone()
                live = {int(p) for p in table.flatten()}
                stale = min(WARM_PAGES - live)
                INJECTED.setdefault("row", 1)
                INJECTED.setdefault("logical_block", 0)
                INJECTED.setdefault("page", int(table[1, 0]))
                INJECTED.setdefault("read_page", stale)
                table[1, 0] = stale
                md.block_table = table
            return kernel(self, layer, query, key, value, kv_cache, md, *args, **kwargs)
    else:
        raise SystemExit(f"unknown scenario {scenario!r}")
    impl.forward = forward


# The stale-prefix scenario's weight update: layer 0's input RMSNorm weight
# times this (the trainer's recompute applies the same).
NORM_SCALE = 1.25


def update_weights_keeping_the_cache(llm, av) -> None:
    """Generates the prompts once under weight version 1 (their full
    blocks enter the prefix cache), then updates the weights in place and
    moves to version 2 without llm.reset_prefix_cache()."""
    from vllm import SamplingParams
    av.set_rl_step(1)
    llm.generate([{"prompt_token_ids": p} for p in PROMPTS],
                 SamplingParams(max_tokens=1, temperature=0.0))

    def scale_norm(worker):
        model = worker.model_runner.get_model()
        norm = model.model.layers[0].input_layernorm.weight
        norm.data.mul_(NORM_SCALE)
    llm.collective_rpc(scale_norm)
    av.set_rl_step(2)


def outcome(result) -> dict:
    out = {"step": result.step, "layer": result.layer,
           "verdict": None if result.verdict is None else result.verdict.name,
           "error": None if result.error is None else str(result.error)[:300]}
    report = result.report
    if report is not None:
        top = report.diagnosis
        out["diagnosis"] = top.hypothesis if top else None
        out["diagnosis_summary"] = top.summary if top else ""
        out["page"] = top.page if top else None
        out["row"] = top.row if top else None
        out["rope_checks"] = {c.what: c.verdict for c in report.proto.rope_checks}
        out["request_ids"] = list(report.proto.labels.request_ids) \
            if report.proto.HasField("labels") else []
        out["precision_source"] = report.proto.provenance.precision_source
    return out


def main() -> int:
    model, scenario, out_path = sys.argv[1:4]
    inject(scenario)
    from vllm import LLM, SamplingParams
    t0 = time.monotonic()
    llm = LLM(model=model, dtype="bfloat16", gpu_memory_utilization=0.1,
              max_model_len=512, enforce_eager=True, block_size=32, max_num_seqs=4,
              seed=0)
    t1 = time.monotonic()
    import attnaudit.vllm as av
    summaries = []
    av.add_step_callback(lambda s: summaries.append(
        {"step": s.step, "layers": list(s.layers), "passed": s.passed,
         "drifted": s.drifted, "failed": s.failed, "dropped": s.dropped,
         "worst_layer": s.worst_layer, "worst_share": s.worst_share,
         "top_diagnosis": s.top_diagnosis, "rl_step": s.rl_step,
         "config_findings": list(s.config_findings),
         "stale_prefix": list(s.stale_prefix)}))
    params = SamplingParams(max_tokens=int(os.environ.get("E2E_TOKENS", "24")),
                            temperature=0.0, ignore_eos=True, logprobs=1)
    if os.environ.get("E2E_RL_STEP"):
        llm.collective_rpc("attnaudit_set_rl_step", args=(int(os.environ["E2E_RL_STEP"]),))
    # A finished request first: its pages keep its K/V, as in a busy engine.
    llm.generate([{"prompt_token_ids": p} for p in WARMUP],
                 SamplingParams(max_tokens=1, temperature=0.0))
    if scenario == "stale-prefix":
        update_weights_keeping_the_cache(llm, av)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)
    t2 = time.monotonic()
    flushed = av.flush(120)
    plugin = av.plugin()
    if plugin is not None:
        results = [outcome(r) for r in plugin.auditor().results()] \
            if plugin._auditor is not None else []
    else:
        results = []
    data = {
        "scenario": scenario, "engine_up_s": t1 - t0, "generate_s": t2 - t1,
        "flushed": flushed, "active": plugin is not None,
        "counters": plugin.counters() if plugin else {},
        # What the plugin declared for each backend (the engine probe's
        # measurement, or the preset it fell back to).
        "precision": {label: {"measured": d.measured, "line": d.line,
                              "precision": d.precision, "cast_point": d.cast_point}
                      for label, d in plugin.precision.declarations().items()}
        if plugin else {},
        "tokens": [list(o.outputs[0].token_ids) for o in outs],
        "logprobs": [[float(lp[t].logprob) for t, lp in
                      zip(o.outputs[0].token_ids, o.outputs[0].logprobs or [])]
                     for o in outs],
        "results": results, "summaries": summaries, "injected": INJECTED,
    }
    with open(out_path, "w") as f:
        json.dump(data, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
