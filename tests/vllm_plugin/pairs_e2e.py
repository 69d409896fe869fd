"""Train–rollout pairs end to end on the CPU (`make vllm-plugin`).

usage: pairs_e2e.py --server BUILD/bin/attnaudit-server --work DIR

Run with the conformance venv's python. The same tiny random Llama as
e2e.py (its model folder is reused) generates with vLLM's CPU engine and
the plugin, which saves every audited snapshot (ATTNAUDIT_VLLM_SAVE_DIR);
then transformers recomputes the same tokens (prompt and generated) with
attnaudit.trainer's hook capturing the rollout's (request, position) rows
at every layer, and attnaudit.pairs joins them, each side audited by a
real attnaudit-server:

  clean                   no pair drifts; at layer 0 every pair is
                          consistent or within-noise (deeper layers' inputs
                          carry the two stacks' rounding, amplified by
                          this model's peaked attention: inputs-differ
                          there is no finding, attnaudit.pairs);
  trainer-wrong-scale     the trainer's sdpa scaling by 1.25x its declared
                          scale: trainer-drift;
  rollout stale-page      vLLM reads a stale block: rollout-drift on the
                          row the bug struck;
  trainer-norm-epsilon    the trainer's RMSNorm epsilon 1e-2 instead of
                          the configuration's: inputs-differ, first at
                          layer 0;
  stale-prefix            vLLM's weights updated (layer 0's input norm)
                          without resetting its prefix cache, the trainer
                          recomputing with the new weights: the plugin names
                          the rows that read old blocks, and the pairs are
                          stale-prefix-kv at layer 0 (q agrees, the cached
                          K/V do not).

Each case's sides are also joined by the server: the rollout snapshots
(labelled role rollout by the plugin) and the trainer's (role trainer, by
the hook) are audited under one run per case, and ListPairs must give the
same verdict per (layer, request, position) as attnaudit.pairs here.

Prints a table; exits 1 on any failed check.
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import tempfile
import time
from typing import Dict, List, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import e2e  # noqa: E402  (the model, the server and the engine runs)
from engine_run import PROMPTS  # noqa: E402


def rollout(model: str, work: str, server, scenario: str) -> Tuple[dict, List[str]]:
    save = os.path.join(work, f"saved-{scenario}")
    for old in glob.glob(os.path.join(save, "*.pb")):
        os.remove(old)
    env = {"ATTNAUDIT_VLLM_SERVER": server.address, "ATTNAUDIT_VLLM_SAMPLE_EVERY": "4",
           "ATTNAUDIT_VLLM_ROTATE_LAYERS": "0", "ATTNAUDIT_VLLM_RUN": f"pairs-{scenario}",
           "ATTNAUDIT_VLLM_MAX_IN_FLIGHT": "64", "ATTNAUDIT_VLLM_SAVE_DIR": save}
    data = e2e.run(model, scenario, work, env, f"pairs-{scenario}")
    return data, sorted(glob.glob(os.path.join(save, "*.pb")))


def trainer(model_dir: str, data: dict, rollouts, bug: str, run: str) -> list:
    """The trainer's snapshots of the rollouts' rows: each the prompt and
    the tokens the rollout generated for it."""
    import torch
    from transformers import AutoModelForCausalLM

    from attnaudit.trainer import TrainerHook
    wanted: Dict[str, set] = {}
    for snap in rollouts:
        positions = snap.tensor("query_positions")
        for b, rid in enumerate(snap.labels.request_ids):
            wanted.setdefault(str(rid), set()).add(int(positions[b, 0]))
    config = {"rms_norm_eps": 1e-2} if bug == "norm-epsilon" else {}
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16,
                                                 attn_implementation="sdpa", **config)
    if bug == "new-weights":  # the rollout's weight update, recomputed
        from engine_run import NORM_SCALE
        with torch.no_grad():
            model.model.layers[0].input_layernorm.weight.mul_(NORM_SCALE)
    snaps: list = []
    hook = TrainerHook(snaps.append, max_rows=64, run=run)
    hook.install()
    restore = _inject_trainer_bug(bug)
    try:
        for rid, positions in wanted.items():
            # vLLM numbers requests from the warm-up's 0; each generation
            # of the prompts takes the next len(PROMPTS) numbers.
            i = (int(rid.split("-")[0]) - 1) % len(PROMPTS)
            ids = torch.tensor([PROMPTS[i] + data["tokens"][i]])
            with torch.no_grad(), hook.capture([rid], positions=lambda _s, _n, p=positions: p):
                model(ids)
    finally:
        restore()
    if hook.errors:
        raise RuntimeError(f"trainer hook: {hook.last_error!r}")
    return snaps


def _inject_trainer_bug(bug: str):
    if bug != "wrong-scale":
        return lambda: None
    from transformers.integrations import sdpa_attention
    from transformers.modeling_utils import AttentionInterface
    right = sdpa_attention.sdpa_attention_forward

    def wrong(module, query, key, value, mask, *args, scaling=None, **kwargs):
        return right(module, query, key, value, mask, *args, scaling=scaling * 1.25, **kwargs)
    AttentionInterface._global_mapping["sdpa"] = wrong
    return lambda: AttentionInterface._global_mapping.__setitem__("sdpa", right)


def pair_all(rollouts, trainers, client, run: str) -> list:
    """Every (rollout snapshot, trainer snapshot) of one layer that share a
    row, compared; each side audited once, under `run` (the trainer's
    snapshots have it from the hook), so the server joins the same sides."""
    from attnaudit import pairs
    reports = {}

    def audit(snap):
        if id(snap) not in reports:
            snap.labels.run = run
            reports[id(snap)] = client.audit(snap)
        return reports[id(snap)]
    out = []
    for r in rollouts:
        ids = {str(x) for x in r.labels.request_ids}
        for t in trainers:
            if t.labels.layer != r.labels.layer or str(t.labels.request_ids[0]) not in ids:
                continue
            out.append(pairs.compare(r, t, rollout_report=audit(r), trainer_report=audit(t)))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--work", default=None)
    args = ap.parse_args()
    work = args.work or tempfile.mkdtemp(prefix="attnaudit_pairs_e2e_")
    os.makedirs(work, exist_ok=True)
    model = os.path.join(work, "tiny-llama3")
    e2e.make_model(model)
    server = e2e.Server(args.server, work)
    c = e2e.Checks()
    import attnaudit
    from attnaudit import Snapshot
    try:
        with attnaudit.AuditClient(server.address) as client:
            runs = {}
            for scenario in ("clean", "stale-page", "stale-prefix"):
                data, files = rollout(model, work, server, scenario)
                runs[scenario] = (data, [Snapshot.load(f) for f in files])
                c.check(scenario, len(files) > 0, f"{len(files)} rollout snapshots saved")
            for label, scenario, bug, want in (
                    ("clean", "clean", "", None),
                    ("trainer-wrong-scale", "clean", "wrong-scale", {"trainer-drift"}),
                    ("rollout-stale-page", "stale-page", "", {"rollout-drift"}),
                    ("trainer-norm-epsilon", "clean", "norm-epsilon", None),
                    ("stale-prefix", "stale-prefix", "new-weights", None)):
                data, rollouts = runs[scenario]
                run = f"joined-{label}"
                reports = pair_all(rollouts, trainer(model, data, rollouts, bug, run),
                                   client, run)
                verdicts = sorted({p.verdict for p in reports})
                rows = sum(len(p.rows) for p in reports)
                if want is not None:
                    c.check(label, rows > 0 and set(verdicts) <= want,
                            f"{rows} pairs over {len(reports)} snapshot pairs: {verdicts}")
                elif bug == "new-weights":
                    check_stale_prefix(c, label, reports, data)
                elif bug:
                    check_inputs_differ(c, label, reports)
                else:
                    check_clean(c, label, reports)
                check_joined(c, label, client, run, reports)
                worst = max(reports, key=lambda p: max(r.out_max_abs for r in p.rows))
                print(f"{label}: {worst.line()}")
    finally:
        server.stop()
    width = max(len(r[0]) for r in c.rows)
    for label, status, detail in c.rows:
        print(f"{label:<{width}}  {status:<4}  {detail}")
    if c.failures:
        print(f"\n{len(c.failures)} check(s) failed; outputs under {work}")
        return 1
    print("\nall checks passed")
    return 0


def by_layer(reports) -> Dict[int, List[str]]:
    out: Dict[int, set] = {}
    for p in reports:
        out.setdefault(p.layer, set()).update(r.verdict for r in p.rows)
    return {k: sorted(v) for k, v in sorted(out.items())}


def check_clean(c, label: str, reports) -> None:
    from attnaudit import pairs
    layers = by_layer(reports)
    first = pairs.first_layer_inputs_differ(reports)
    c.check(label, bool(layers) and set(layers.get(0, [])) <= {"consistent", "within-noise"}
            and not any("drift" in v for vs in layers.values() for v in vs)
            and first != 0,
            f"no drift; layer 0 within noise; first inputs-differ at layer {first}; "
            f"by layer {layers}")


def check_joined(c, label: str, client, run: str, reports) -> None:
    """The server's pairs of `run` (ListPairs): the same (layer, request,
    position) rows as the client's, with the same verdicts."""
    want = {(p.layer, r.request_id, r.position): r.verdict for p in reports for r in p.rows}
    deadline = time.monotonic() + 60  # the joins follow the audits
    while True:
        got, rows = {}, 0
        for p in client.list_pairs(run=run):
            for r in p.rows:
                got[(p.layer, r.request_id, r.position)] = r.verdict
                rows += 1
        if rows >= len(want) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    differ = sorted(k for k in want.keys() | got.keys() if want.get(k) != got.get(k))
    detail = (f"the server joined the same {rows} pairs, the same verdicts" if not differ
              else f"{len(differ)} of {len(want)} pairs unlike the server's {rows}, e.g. "
                   f"{differ[0]}: here {want.get(differ[0])}, server {got.get(differ[0])}")
    c.check(label, not differ and rows == len(want), detail)


def check_stale_prefix(c, label: str, reports, data: dict) -> None:
    layers = by_layer(reports)
    named = sorted({x for s in data["summaries"] for x in s.get("stale_prefix", [])})
    c.check(label, len(named) > 0,
            f"the plugin names the rows that read old blocks: {named[:2]}")
    c.check(label, "stale-prefix-kv" in layers.get(0, []) and
            not any("drift" in v for vs in layers.values() for v in vs),
            f"stale-prefix-kv at layer 0; by layer {layers}")


def check_inputs_differ(c, label: str, reports) -> None:
    from attnaudit import pairs
    layers = by_layer(reports)
    first = pairs.first_layer_inputs_differ(reports)
    c.check(label, first == 0 and not any("drift" in v for vs in layers.values() for v in vs),
            f"inputs-differ first at layer {first}; by layer {layers}")


if __name__ == "__main__":
    sys.exit(main())
