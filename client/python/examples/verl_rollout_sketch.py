"""Sketch: attnaudit in a verl rollout worker.

NOT RUNNABLE AS IS. verl moves fast; this follows the shape of its vLLM
rollout (a worker class that owns an in-process vLLM engine and implements
generate_sequences, plus a trainer that logs rollout/trainer mismatch
metrics such as training/rollout_probs_diff_* and rollout_corr/k3_kl).
Names marked "# verl:" are verl's; check them against your version.

What goes where:

1. Worker init: one AuditClient and one RolloutAuditor per rollout worker,
   and the attention hook installed into the engine before it is built
   (vllm_backend_sketch.wrap_flash_attention_impl).
2. Every decode step: the hook samples and audits by itself; the worker
   does nothing per step.
3. After each generate_sequences: export the auditor's counters and latest
   verdicts as metrics next to verl's own mismatch metrics, so a spike in
   rollout_probs_diff_max can be read against "attention drifted on layer
   15 at step 1200" or "attention clean: look elsewhere".
4. Optional: when the trainer also recomputes log-probs, an audit with an
   lm_head slice and the selected tokens reports the same family of metrics
   (k1/k3 KL, importance-ratio statistics) for the attention alone.
"""

from __future__ import annotations

import dataclasses
import os

import attnaudit

from vllm_backend_sketch import AUDITOR, wrap_flash_attention_impl  # this folder


class AuditedVLLMRollout:                      # verl: subclass vLLMRollout
    def __init__(self, *args, **kwargs):
        from vllm.v1.attention.backends.flash_attn import FlashAttentionImpl  # vLLM:
        wrap_flash_attention_impl(FlashAttentionImpl)
        super().__init__(*args, **kwargs)      # verl: builds the vLLM engine
        self.auditor = AUDITOR
        self._last = attnaudit.AuditorCounters()

    def generate_sequences(self, prompts):     # verl: DataProto in, DataProto out
        output = super().generate_sequences(prompts)
        output.meta_info.setdefault("metrics", {}).update(self.audit_metrics())  # verl:
        return output

    def audit_metrics(self) -> dict:
        """Counters since the last call and the latest verdict per layer."""
        now = self.auditor.counters
        delta = {f.name: getattr(now, f.name) - getattr(self._last, f.name)
                 for f in dataclasses.fields(now)}
        self._last = now
        metrics = {f"attnaudit/{k}": v for k, v in delta.items()}
        for layer, result in self.auditor.latest.items():
            if result.report is None:
                continue
            er = result.report.engine_vs_reference
            metrics[f"attnaudit/layer{layer}/drift"] = float(result.report.drifted)
            if er is not None and er.out is not None:
                metrics[f"attnaudit/layer{layer}/out_max_abs"] = er.out.max_abs
                metrics[f"attnaudit/layer{layer}/out_over_tol"] = er.out.over_tolerance
            if er is not None and er.lse is not None:
                metrics[f"attnaudit/layer{layer}/lse_max_abs"] = er.lse.max_abs
        return metrics

    def shutdown(self):                        # verl: on worker teardown
        self.auditor.close(timeout=30)


# Trainer side (optional): audit one decode step with log-probs, so the
# report's logprob_agreement speaks verl's language:
#
#   snap = attnaudit.Snapshot.from_paged_kv(
#       q, kv_cache, None, block_table_cpu, seq_lens_cpu, layout="vllm",
#       engine_out=out, selected_token_ids=sampled_ids,          # [B]
#       lm_head=lm_head_rows,                                    # [V, Hq*D]
#       engine_logprobs=rollout_logprobs,                        # [B]
#       logprob_temperature=temperature)
#   a = client.audit(snap).engine_vs_reference.logprob_agreement
#   metrics["attnaudit/k3_kl"] = a.k3_kl        # cf. rollout_corr/k3_kl
#   metrics["attnaudit/ratio_max"] = a.ratio_max
#
# Run the worker with ATTNAUDIT_ADDR=host:port (and ATTNAUDIT_TOKEN when the
# server requires one); nothing else changes in the verl config.
if __name__ == "__main__":
    raise SystemExit("a sketch: read it, do not run it (" + os.path.basename(__file__) + ")")
