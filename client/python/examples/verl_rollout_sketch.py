"""Sketch: attnaudit in a verl rollout worker.

NOT RUNNABLE AS IS. verl moves fast; this follows the shape of its vLLM
rollout (a worker class that owns an in-process vLLM engine and implements
generate_sequences, plus a trainer that logs rollout/trainer mismatch
metrics such as training/rollout_probs_diff_* and rollout_corr/k3_kl).
Names marked "# verl:" are verl's; check them against your version.

What goes where:

1. Nothing in the worker's code: `pip install attnaudit` in the rollout
   image and ATTNAUDIT_VLLM_* settings in its environment make vLLM load
   the attnaudit plugin (attnaudit.vllm), which samples decode steps and
   audits them by itself.
2. After each generate_sequences: export the plugin's counters and the
   latest step summary as metrics next to verl's own mismatch metrics, so
   a spike in
   rollout_probs_diff_max can be read against "attention drifted on layer
   15 at step 1200" or "attention clean: look elsewhere". (verl's rollout
   engine runs in the worker's process: add_step_callback works there.)
3. Optional: when the trainer also recomputes log-probs, an audit with an
   lm_head slice and the selected tokens reports the same family of metrics
   (k1/k3 KL, importance-ratio statistics) for the attention alone.
"""

from __future__ import annotations

import os
import threading

import attnaudit.vllm


class AuditedVLLMRollout:                      # verl: subclass vLLMRollout
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)      # verl: builds the vLLM engine
        self._lock = threading.Lock()
        self._summaries = []
        # False when the plugin is not configured (no ATTNAUDIT_VLLM_SERVER).
        attnaudit.vllm.add_step_callback(self._on_step)
        self._last = {}

    def _on_step(self, summary):               # a background thread
        with self._lock:
            self._summaries.append(summary)

    def generate_sequences(self, prompts):     # verl: DataProto in, DataProto out
        output = super().generate_sequences(prompts)
        output.meta_info.setdefault("metrics", {}).update(self.audit_metrics())  # verl:
        return output

    def audit_metrics(self) -> dict:
        """Audits since the last call: counts, and the worst step's layer,
        share of tolerance and diagnosis."""
        with self._lock:
            summaries, self._summaries = self._summaries, []
        metrics = {"attnaudit/audited_steps": len(summaries),
                   "attnaudit/passed": sum(s.passed for s in summaries),
                   "attnaudit/drifted": sum(s.drifted for s in summaries),
                   "attnaudit/dropped": sum(s.dropped for s in summaries)}
        scored = [s for s in summaries if s.worst_share is not None]
        if scored:
            worst = max(scored, key=lambda s: (s.drifted > 0, s.worst_share))
            metrics.update(worst.as_dict(prefix="attnaudit/worst/"))
        return metrics

    def shutdown(self):                        # verl: on worker teardown
        attnaudit.vllm.flush(timeout=30)


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
# Run the worker with ATTNAUDIT_VLLM_SERVER=host:port (and
# ATTNAUDIT_VLLM_TOKEN_FILE when the server requires a token); nothing else
# changes in the verl config.
if __name__ == "__main__":
    raise SystemExit("a sketch: read it, do not run it (" + os.path.basename(__file__) + ")")
