"""Train–rollout pairs in an RL loop: the trainer's attention beside the
rollout's, logged per training step.

The rollout side saves its snapshots (the vLLM plugin with
ATTNAUDIT_VLLM_SAVE_DIR, or RolloutAuditor snapshots you keep); the
trainer's log-prob recompute runs under attnaudit.trainer's hook, which
captures the same (request id, position) rows; attnaudit.pairs joins them
and says, per pair, whether the two agree, which side is off, or whether
the difference entered before attention. `log_pairs` puts the counts in
Weights & Biases when a run is active, else prints the report lines.

Sketch of the loop (names of your trainer in <>):

    hook = TrainerHook(snapshots.append, run=run_name, max_rows=64)
    hook.install()
    rollouts = load_rollouts(save_dir, step)          # below
    wanted = rows_of(rollouts)                         # request id -> positions
    with torch.no_grad(), hook.capture(<batch request ids>, step=step,
                                       positions=lambda rid, n: wanted.get(rid, ())):
        <old_log_probs = model(input_ids, attention_mask=mask)>
    log_pairs(pair_step(rollouts, snapshots, client), step)

Runs end to end on the CPU in tests/vllm_plugin/pairs_e2e.py (`make
vllm-plugin`).
"""

from __future__ import annotations

import glob
import os
import sys
from typing import Dict, List, Set

from attnaudit import Snapshot, pairs


def load_rollouts(save_dir: str, step_label: str = "") -> List[Snapshot]:
    """The rollout snapshots the vLLM plugin saved (optionally of one
    engine step, e.g. "step40")."""
    pattern = os.path.join(save_dir, f"*{step_label}*.pb")
    return [Snapshot.load(path) for path in sorted(glob.glob(pattern))]


def rows_of(rollouts: List[Snapshot]) -> Dict[str, Set[int]]:
    """request id -> the positions the rollout audited."""
    wanted: Dict[str, Set[int]] = {}
    for snap in rollouts:
        positions = snap.tensor("query_positions")
        for b, rid in enumerate(snap.labels.request_ids):
            wanted.setdefault(str(rid), set()).add(int(positions[b, 0]))
    return wanted


def pair_step(rollouts: List[Snapshot], trainers: List[Snapshot],
              client: object) -> List[pairs.PairReport]:
    """Every rollout snapshot with each trainer snapshot of its layer that
    shares a row; each side audited once by the server."""
    reports = {}

    def audit(snap: Snapshot) -> object:
        if id(snap) not in reports:
            reports[id(snap)] = client.audit(snap)  # type: ignore[attr-defined]
        return reports[id(snap)]
    out = []
    for r in rollouts:
        ids = {str(x) for x in r.labels.request_ids}
        for t in trainers:
            if t.labels.layer == r.labels.layer and str(t.labels.request_ids[0]) in ids:
                out.append(pairs.compare(r, t, rollout_report=audit(r),
                                         trainer_report=audit(t)))
    return out


def log_pairs(reports: List[pairs.PairReport], step: int) -> None:
    """The step's pair counts to W&B when a run is active, else the lines."""
    wandb = sys.modules.get("wandb")
    if wandb is not None and getattr(wandb, "run", None) is not None:
        wandb.log(pairs.as_metrics(reports), step=step)
        return
    for report in reports:
        if report.verdict not in ("consistent", "within-noise"):
            print(f"step {step}: {report.line()}", flush=True)
    print(f"step {step}: {pairs.as_metrics(reports)}", flush=True)
