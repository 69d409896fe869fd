"""The realistic-scale sweeps: clean families over many seeds and the bug
catalogue, audited by the CLI, one JSON line per run (resumable).

For every (case, seed) of realistic_cases.py it runs the real engine
(engines/realistic_*.py), writes the snapshot to a temporary file, runs
`CLI check FILE --json`, and appends to the results file:

  case, family, engine, mode, dtype, decl, kind, bug, seed, the draw (arch,
  B, heads, D, keys, page, threads and vLLM's KV splits, RoPE table,
  positions), the verdict, the rules that fired (E-R/E-P/P-R out or lse
  tolerance, statistical rms / mean / bias, RoPE checks, hull, invalid,
  inconclusive), every statistic/limit ratio (calibrate.ratios_of), the
  E-R out tolerance, the bug's own effect on the engine output
  (max |E_bug - E_clean|, and / tolerance), the top-3 diagnoses and
  whether the top one is right (replay.judge), seconds spent.

A run already in the results file for the same CLI (its sha256) is not
rerun (unless --force), so a sweep can be stopped (--budget-min, Ctrl-C)
and resumed, and rerun against a new CLI into the same file; each record
also carries the suite's code version (code_sha). Of a (case, seed) run
more than once, the tables take the last record. Seeds run in the outer loop:
stopping early leaves every family with the same number of seeds.

  build/conformance-venv/bin/python tests/conformance/sweep.py \\
      [--set clean,long,bugs] [--seeds N] [--first-seed S] [--only PATTERN] \\
      [--results FILE] [--cli PATH] [--budget-min M] [--keep DIR]
  python3 tests/conformance/sweep.py --tables TABLES [--docs] [--results FILE]
      [--cli-sha PREFIX|any]     (tables only: no torch needed; --results
      may name several files, read in order)

--docs rewrites the block between `<!-- sweep:begin -->` and
`<!-- sweep:end -->` in docs/CONFORMANCE.md with the tables.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter, OrderedDict, defaultdict
from typing import Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import replay  # noqa: E402
from calibrate import ratios_of  # noqa: E402
from replay import field, verdict_name  # noqa: E402

DRIVERS = {"vllm-cpu": "realistic_vllm_cpu", "vllm-cpu-emu-rtz": "realistic_vllm_cpu",
           "vllm-cpu-emu-rne": "realistic_vllm_cpu", "hf-eager": "realistic_hf",
           "hf-sdpa": "realistic_hf", "torch-flash-cpu": "realistic_torch_flash"}
SHORT = {"ENGINE_VS_REFERENCE": "E-R", "ENGINE_VS_REPLAY": "E-P",
         "REPLAY_VS_REFERENCE": "P-R", "ENGINE_VS_EMULATION": "E-M"}
DEFAULT_RESULTS = os.path.join(REPO, "build", "conformance-sweep", "results.jsonl")
DOCS = os.path.join(REPO, "docs", "CONFORMANCE.md")


def code_sha() -> str:
    """The realistic suite's own code (drivers, data, catalogue): a change
    reruns the sweep's cases, as a new CLI does."""
    h = hashlib.sha256()
    names = ["realistic_cases.py", "engines/realistic.py", "engines/realistic_vllm_cpu.py",
             "engines/realistic_hf.py", "engines/realistic_torch_flash.py",
             "engines/common.py", "engines/vllm_cpu.py", "engines/torch_flash.py"]
    for n in names:
        with open(os.path.join(HERE, n), "rb") as f:
            h.update(f.read())
    return h.hexdigest()[:12]


def driver(engine: str):
    import importlib
    return importlib.import_module(f"engines.{DRIVERS[engine]}")


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# ----------------------------------------------------------------------
# Reading a report
# ----------------------------------------------------------------------

_STAT_RE = re.compile(r"\b(rms|mean|bias)\b")


def rules_of(report: dict) -> List[str]:
    """What made the report not PASS: "E-R out tol", "E-R lse tol",
    "E-R stat rms" (mean, bias), "E-R nonfinite", "rope q" (k, table...),
    "hull", "invalid", "inconclusive"."""
    out: List[str] = []
    for c in field(report, "comparisons", []) or []:
        short = SHORT.get(str(field(c, "comparison", "")).replace("COMPARISON_", ""), "?")
        if verdict_name(field(c, "verdict")) == "PASS":
            continue
        for r in field(c, "reasons", []) or []:
            r = str(r)
            if r.startswith("statistical"):
                kinds = sorted(set(_STAT_RE.findall(r.split(";")[0]))) or ["?"]
                out += [f"{short} stat {k}" for k in kinds]
            elif "NaN/Inf" in r:
                out.append(f"{short} nonfinite")
            elif r.startswith("out:"):
                out.append(f"{short} out tol")
            elif r.startswith("lse:"):
                out.append(f"{short} lse tol")
            elif r.startswith("logprob"):
                out.append(f"{short} logprob")
            else:
                out.append(f"{short} other")
    for rc in field(report, "rope_checks", []) or []:
        if verdict_name(field(rc, "verdict")) != "PASS":
            out.append(f"rope {field(rc, 'what', '?')}")
    hull = field(report, "hull")
    if hull and int(field(hull, "outside", 0) or 0) > 0:
        out.append("hull")
    v = verdict_name(field(report, "verdict"))
    if v == "INVALID":
        out.append("invalid")
    if v == "INCONCLUSIVE" or field(report, "inconclusive_reasons"):
        out.append("inconclusive")
    return sorted(set(out))


def stat_detail(report: dict) -> Dict[str, float]:
    """The statistical detector's firing figures per comparison: rms^2 /
    limit (what it compares), |mean| / limit, |bias| / limit, the worst
    group of each."""
    out: Dict[str, float] = {}
    for c in field(report, "comparisons", []) or []:
        short = SHORT.get(str(field(c, "comparison", "")).replace("COMPARISON_", ""), "?")
        for g in field(field(c, "statistical"), "worst", []) or []:
            rl, ml = float(field(g, "rms_limit", 0) or 0), float(field(g, "mean_limit", 0) or 0)
            if rl > 0:
                v = (float(field(g, "rms", 0) or 0) / rl) ** 2
                out[f"{short} rms2"] = max(out.get(f"{short} rms2", 0.0), v)
            if ml > 0:
                for k in ("mean", "bias"):
                    v = abs(float(field(g, k, 0) or 0)) / ml
                    out[f"{short} {k}"] = max(out.get(f"{short} {k}", 0.0), v)
    return out


# ----------------------------------------------------------------------
# One run
# ----------------------------------------------------------------------


def expect_of(spec, location) -> dict:
    if spec.kind == "clean":
        out = {"verdict": "PASS", "hypothesis": None}
        if spec.decl == "undeclared":
            # The widest envelope may be unable to verify a clean engine:
            # INCONCLUSIVE is then its honest answer, not a false alarm.
            out["also_ok"] = ["INCONCLUSIVE"]
        return out
    out = {"verdict": "DRIFT", "hypothesis": spec.expected_hypothesis}
    if location:
        where = {k: int(location[k]) for k in ("row", "logical_block", "page") if k in location}
        if where:
            out["location"] = where
    return out


def one_run(spec, cli: str, cli_sha: str, tmp: str, timeout: float,
            keep: Optional[str]) -> dict:
    base = {"case": spec.name, "family": spec.family, "engine": spec.engine,
            "mode": spec.mode, "dtype": spec.dtype, "decl": spec.decl, "kind": spec.kind,
            "bug": spec.bug, "variant": spec.variant, "size": spec.size,
            "positions": spec.positions, "seed": spec.seed, "cli_sha": cli_sha,
            "code_sha": CODE_SHA,
            "set_arch": spec.arch}
    t0 = time.perf_counter()
    path = os.path.join(tmp, f"run.s{spec.seed}.pb")
    try:
        from engines.common import Unsupported
        try:
            cap = driver(spec.engine).capture(spec)
        except Unsupported as e:
            return {**base, "status": "unsupported", "reason": str(e)}
        cap.snapshot().save(path)
    except Exception:  # noqa: BLE001 - every broken run is reported
        if os.path.exists(path):
            os.unlink(path)
        return {**base, "status": "error",
                "reason": " | ".join(traceback.format_exc().strip().splitlines()[-3:])}
    t_engine = time.perf_counter() - t0
    info = cap.info
    draw = info.get("draw", {})
    base.update(draw=draw, design=info.get("design"), bytes=os.path.getsize(path),
                metadata=info.get("metadata"), narrowing=info.get("narrowing"),
                host=info.get("host"), declaration=info.get("declaration"))
    expect = expect_of(spec, cap.location)
    t1 = time.perf_counter()
    report, rc, error = replay.run_cli(cli, path, timeout)
    t_cli = time.perf_counter() - t1
    res = {**base, "t_engine": round(t_engine, 2), "t_cli": round(t_cli, 2), "expect": expect}
    if report is None:
        res.update(status="error", reason=f"CLI: {error}")
    else:
        entry = {"case": spec.name, "engine": spec.engine, "mode": spec.mode,
                 "dtype": spec.dtype, "kind": spec.kind, "bug": spec.bug, "expect": expect}
        j = replay.judge(entry, report, rc, error)
        ratios, mism = ratios_of(report)
        tol = replay.er_out_tolerance(report)
        effect = info.get("bug_effect")
        diags = replay.diagnoses(report)
        top = diags[0] if diags else None
        res.update(
            status="ok", verdict=j["verdict"], ok=bool(j["ok"]), rules=rules_of(report),
            ratios={k: (round(v, 5) if math.isfinite(v) else str(v)) for k, v in ratios.items()},
            stat=stat_detail(report), rope_mismatches=mism, er_out_tol=tol,
            effect=effect, effect_lse=info.get("bug_effect_lse"),
            effect_over_tol=(effect / tol if effect is not None and tol else None),
            top=j["top"], diagnosis_ok=j["diagnosis_ok"],
            hypothesis_ok=(None if expect.get("hypothesis") is None or not diags else
                           field(top, "hypothesis") == expect["hypothesis"]),
            top_explains=bool(field(top, "explains")) if top else None,
            notes=j.get("notes") or [], reasons=replay.reasons(report, limit=4),
            inconclusive=list(field(report, "inconclusive_reasons", []) or []),
            sensitivity=list(field(field(report, "provenance"), "sensitivity", []) or []),
            profile=field(field(report, "provenance"), "engine_profile"),
            precision_source=field(field(report, "provenance"), "precision_source"),
            rope_source=field(field(report, "provenance"), "rope_source"))
    bad = res["status"] == "error" or (res["status"] == "ok" and not res["ok"]) or \
        res.get("diagnosis_ok") is False
    if keep and bad and os.path.exists(path):
        os.makedirs(keep, exist_ok=True)
        stem = os.path.join(keep, f"{spec.name}.s{spec.seed}")
        shutil.copy(path, stem + ".pb")
        if report is not None:
            with open(stem + ".json", "w") as f:
                json.dump(report, f, indent=1)
    if os.path.exists(path):
        os.unlink(path)
    return res


def load_results(path: str) -> List[dict]:
    out = []
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        out.append(json.loads(line))
                    except json.JSONDecodeError:
                        pass      # a line cut by a kill: rerun
    return out


def run_sweep(args) -> int:
    from realistic_cases import all_realistic
    sets = tuple(args.set.split(","))
    cases = [c for c in all_realistic(sets)
             if not args.only or any(p in c.name or p in c.family for p in args.only.split(","))]
    if not cases:
        print("sweep.py: no case matches", file=sys.stderr)
        return 2
    import torch
    torch.set_num_threads(1)
    os.makedirs(os.path.dirname(os.path.abspath(args.results)), exist_ok=True)
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    deadline = time.time() + args.budget_min * 60 if args.budget_min else None
    n_done = n_new = 0
    with tempfile.TemporaryDirectory(prefix="attnaudit-sweep-") as tmp:
        cli = os.path.join(tmp, "attnaudit")
        shutil.copy2(args.cli, cli)
        cli_sha = sha256(cli)[:16]
        done = set() if args.force else {
            (r["case"], r["seed"]) for r in load_results(args.results)
            if r.get("cli_sha") == cli_sha and r.get("status") in ("ok", "unsupported")}
        print(f"sweep.py: {len(cases)} cases x {len(seeds)} seeds, CLI sha {cli_sha}, "
              f"code {CODE_SHA}, "
              f"{len(done)} runs already in {args.results}", flush=True)
        with open(args.results, "a") as out:
            for seed in seeds:
                t_seed = time.perf_counter()
                for spec in cases:
                    if (spec.name, seed) in done:
                        n_done += 1
                        continue
                    if deadline and time.time() > deadline:
                        print(f"sweep.py: budget of {args.budget_min} min reached "
                              f"({n_new} runs this call)", flush=True)
                        return 0
                    res = one_run(spec.replace(seed=seed), cli, cli_sha, tmp, args.timeout,
                                  args.keep)
                    out.write(json.dumps(res) + "\n")
                    out.flush()
                    n_new += 1
                    flag = ""
                    if res["status"] != "ok":
                        flag = f"{res['status'].upper()}: {res.get('reason', '')[:200]}"
                    elif not res["ok"]:
                        flag = f"{res['verdict']} {','.join(res['rules'])}"
                    elif res.get("diagnosis_ok") is False:
                        flag = f"diagnosis: {'; '.join(res['top'][:1])}"
                    if flag or args.verbose:
                        print(f"  {spec.name} s{seed}: {flag or res.get('verdict')} "
                              f"({res.get('t_engine', 0)}+{res.get('t_cli', 0)} s)", flush=True)
                print(f"seed {seed}: {time.perf_counter() - t_seed:.0f} s", flush=True)
    print(f"sweep.py: {n_new} new runs, {n_done} already done", flush=True)
    return 0


# ----------------------------------------------------------------------
# Tables
# ----------------------------------------------------------------------


def _f(x, digits=2) -> str:
    if x is None:
        return "-"
    if isinstance(x, str):
        return x
    if math.isinf(x):
        return "inf"
    if x >= 100:
        return f"{x:.0f}"
    return f"{x:.{digits}f}"


def _max_ratio(r: dict, keys=None) -> (float, str):
    best, what = 0.0, ""
    for k, v in (r.get("ratios") or {}).items():
        if k.startswith("rope "):
            continue
        v = float(v)
        if keys and not any(k.startswith(p) for p in keys):
            continue
        if v > best:
            best, what = v, k
    return best, what


def select(results: List[dict], cli_sha: Optional[str]) -> (List[dict], str):
    """The runs of one CLI (the given sha prefix, else the latest line's;
    "any": every CLI, for sweeps resumed across CLIs whose reports are
    known equal); of a (case, seed) run more than once, the last."""
    if not results:
        return [], ""
    sha = cli_sha or results[-1].get("cli_sha", "")
    runs = [r for r in results
            if sha == "any" or r.get("cli_sha", "").startswith(sha)]
    latest: "OrderedDict[tuple, dict]" = OrderedDict()
    for r in runs:                    # the last record of a (case, seed) wins
        latest[(r["case"], r["seed"])] = r
    return list(latest.values()), sha


MODE_ORDER = ("post", "post+rolling", "pre-q", "pre-qk")
RULE_SHORT = {"E-R out tol": "out", "E-R lse tol": "lse", "E-R stat rms": "rms",
              "E-R stat mean": "mean", "E-R stat bias": "bias", "hull": "hull",
              "inconclusive": "inc", "invalid": "invalid"}


def _fa_rules(rs: List[dict]) -> str:
    """The E-R rules (and RoPE, hull) that fired in these false alarms,
    most frequent first: out (tolerance), lse, rms / mean / bias
    (statistical), rope q / k / table, hull."""
    c = Counter()
    for r in rs:
        for rule in r["rules"]:
            if rule.startswith(("E-P", "P-R")):
                continue
            c[RULE_SHORT.get(rule, rule)] += 1
    return ",".join(k for k, _ in c.most_common(3))


def clean_tables(runs: List[dict]) -> List[str]:
    """False alarms per family: one row per engine x dtype x declaration x
    size, one column per mode ("false alarms/runs rules"), and the worst
    E-R ratio of the row (firing statistic over its limit: rms, |mean|,
    |bias|, or max |diff| / tolerance)."""
    clean = [r for r in runs if r["kind"] == "clean"]
    fam: Dict[tuple, Dict[str, List[dict]]] = defaultdict(lambda: defaultdict(list))
    for r in clean:
        fam[(r["engine"], r["dtype"], r["decl"], r["size"])][r["mode"]].append(r)
    lines = ["| engine | dtype | declared | size | " + " | ".join(MODE_ORDER) +
             " | worst E-R ratio | INCONCLUSIVE | unsupported / errors |",
             "|---|---|---|---|" + "---|" * len(MODE_ORDER) + "---|---|---|"]
    tot = Counter()
    fam_fa = fam_n = 0
    for key in sorted(fam):
        cells, worst, unsup, err, inc = [], (0.0, ""), 0, 0, 0
        for mode in MODE_ORDER:
            rs = fam[key].get(mode, [])
            ok = [r for r in rs if r["status"] == "ok"]
            unsup += sum(r["status"] == "unsupported" for r in rs)
            err += sum(r["status"] == "error" for r in rs)
            if not ok:
                cells.append("-")
                continue
            # A false alarm is a clean engine called DRIFT (or INVALID);
            # INCONCLUSIVE is lost sensitivity, counted apart.
            fa = [r for r in ok if r["verdict"] in ("DRIFT", "INVALID")]
            inc += sum(r["verdict"] == "INCONCLUSIVE" for r in ok)
            fam_n += 1
            fam_fa += bool(fa)
            tot.update(runs=len(ok), fa=len(fa))
            for r in ok:
                w = _max_ratio(r, ("E-R",))
                if w[0] > worst[0]:
                    worst = (w[0], f"{w[1]} ({mode}, s{r['seed']})")
            cells.append(f"**{len(fa)}/{len(ok)}** {_fa_rules(fa)}" if fa else f"0/{len(ok)}")
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | " + " | ".join(cells) +
                     f" | {_f(worst[0])} {worst[1]} | {inc or ''} | "
                     f"{unsup or ''}{' / ' + str(err) if err else ''} |")
    lines.append(f"| **all** | | | | {tot['fa']} false alarms in {tot['runs']} clean runs; "
                 f"{fam_fa} of {fam_n} families with at least one | | | | | | |")
    return lines


def margin_table(runs: List[dict]) -> List[str]:
    clean = [r for r in runs if r["kind"] == "clean" and r["status"] == "ok"]
    cols = ("E-R out", "E-R lse", "E-P out", "P-R out", "E-R stat rms", "E-R stat mean",
            "E-R stat bias", "E-P stat rms", "E-P stat bias")
    grp: Dict[tuple, List[dict]] = defaultdict(list)
    for r in clean:
        grp[(r["engine"], r["dtype"], r["decl"])].append(r)
    lines = ["| engine | dtype | declared | runs | " + " | ".join(cols) + " |",
             "|---|---|---|---|" + "---|" * len(cols)]
    for key in sorted(grp):
        rs = grp[key]
        cells = []
        for c in cols:
            vals = [float(v) for r in rs for k, v in (r.get("ratios") or {}).items()
                    if k == c or k.startswith(c + " (")]
            cells.append(_f(max(vals)) if vals else "-")
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {len(rs)} | " + " | ".join(cells)
                     + " |")
    return lines


def bug_tables(runs: List[dict]) -> List[str]:
    """Detection and diagnosis per bug case. "clean FA" is the false-alarm
    rate of the clean family the case belongs to (engine, mode, dtype,
    declaration): where it is high, DRIFT says nothing about the bug."""
    fam_fa: Dict[tuple, List[bool]] = defaultdict(list)
    for r in runs:
        if r["kind"] == "clean" and r["status"] == "ok":
            fam_fa[(r["engine"], r["mode"], r["dtype"], r["decl"])].append(
                r["verdict"] in ("DRIFT", "INVALID"))  # INCONCLUSIVE is no alarm
    bugs = [r for r in runs if r["kind"] != "clean"]
    grp: Dict[str, List[dict]] = defaultdict(list)
    for r in bugs:
        grp[r["case"]].append(r)
    lines = ["| bug | engine | arch | mode | dtype | declared | where | clean FA | runs | "
             "effect >= tol | detected | detected (effect >= tol) | diagnosis right | "
             "effect/tol (median) | how detected | top diagnoses that miss |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    tot = Counter()
    for case in sorted(grp, key=lambda c: (grp[c][0]["bug"] or "", c)):
        rs = grp[case]
        ok = [r for r in rs if r["status"] == "ok"]
        if not ok:
            reason = next((r.get("reason", "") for r in rs), "")
            r0 = rs[0]
            lines.append(f"| {r0['bug']}{(':' + r0['variant']) if r0.get('variant') else ''} | "
                         f"{r0['engine']} | {r0.get('set_arch') or 'any'} | {r0['mode']} | "
                         f"{r0['dtype']} | {r0['decl']} | | | 0 | | | | | | "
                         f"{rs[0]['status']}: {reason[:80]} | |")
            continue
        r0 = ok[0]
        reach = [r for r in ok if (r.get("effect_over_tol") or 0) >= 1]
        det = [r for r in ok if r["verdict"] == "DRIFT"]
        det_reach = [r for r in reach if r["verdict"] == "DRIFT"]
        judged = [r for r in ok if r.get("diagnosis_ok") is not None]
        right = [r for r in judged if r["diagnosis_ok"]]
        eff = sorted(r["effect_over_tol"] for r in ok if r.get("effect_over_tol") is not None)
        med = eff[len(eff) // 2] if eff else None
        how = Counter(rule for r in det for rule in r["rules"])
        wrong = Counter((r["top"][0].split(" ")[0] if r["top"] else "none")
                        for r in judged if not r["diagnosis_ok"] and r["verdict"] == "DRIFT")
        where = ",".join(x for x in (r0["positions"] if r0["positions"] != "start" else "",
                                     f"table {r0['draw'].get('table') or 'none'}"
                                     if r0["mode"] != "post" else "") if x)
        archs = sorted({r["draw"].get("arch", "?") for r in ok})
        fa = fam_fa.get((r0["engine"], r0["mode"], r0["dtype"], r0["decl"]), [])
        fa_text = f"{100 * sum(fa) / len(fa):.0f} %" if fa else "-"
        tot.update(runs=len(ok), reach=len(reach), det=len(det), det_reach=len(det_reach),
                   judged=len(judged), right=len(right))
        lines.append(
            f"| {r0['bug']}{(':' + r0['variant']) if r0.get('variant') else ''} | {r0['engine']} | "
            f"{','.join(archs) if len(archs) <= 2 else str(len(archs)) + ' archs'} | "
            f"{r0['mode']} | {r0['dtype']} | {r0['decl']} | {where or '-'} | {fa_text} | {len(ok)} | "
            f"{len(reach)} | {len(det)} | {len(det_reach)}/{len(reach)} | "
            f"{len(right)}/{len(judged)} | {_f(med)} | "
            f"{', '.join(f'{k} ({v})' for k, v in how.most_common(3)) or '-'} | "
            f"{', '.join(f'{k} ({v})' for k, v in wrong.most_common(3)) or '-'} |")
    lines.append(f"| **all** | | | | | | | | **{tot['runs']}** | {tot['reach']} | "
                 f"**{tot['det']}** | **{tot['det_reach']}/{tot['reach']}** | "
                 f"**{tot['right']}/{tot['judged']}** | | | |")
    return lines


def summary_lines(runs: List[dict], sha: str) -> List[str]:
    ok = [r for r in runs if r["status"] == "ok"]
    clean = [r for r in ok if r["kind"] == "clean"]
    seeds = Counter(r["seed"] for r in runs)
    t = sum(r.get("t_engine", 0) + r.get("t_cli", 0) for r in runs)
    hosts = Counter((r.get("host") or {}).get("cpu", "?") + " [" +
                    ",".join((r.get("host") or {}).get("flags", [])) + "]" for r in ok)
    if sha == "any":
        clis = Counter(r.get("cli_sha", "?") for r in runs)
        sha = "any of " + ", ".join(f"{c} ({n} runs)" for c, n in clis.most_common())
    return [f"CLI sha256 {sha}; {len(runs)} runs ({len(ok)} audited, "
            f"{sum(r['status'] == 'unsupported' for r in runs)} unsupported, "
            f"{sum(r['status'] == 'error' for r in runs)} errors), seeds "
            f"{min(seeds) if seeds else '-'}..{max(seeds) if seeds else '-'}, "
            f"{t / 3600:.1f} h of engine + CLI time; "
            f"{len(clean)} clean runs, {sum(r['verdict'] in ('DRIFT', 'INVALID') for r in clean)} "
            f"false alarms (DRIFT or INVALID), "
            f"{sum(r['verdict'] == 'INCONCLUSIVE' for r in clean)} INCONCLUSIVE.",
            "", "Hosts: " + "; ".join(f"{h} ({n} runs)" for h, n in hosts.most_common()), ""]


def tables_text(results: List[dict], cli_sha: Optional[str]) -> str:
    runs, sha = select(results, cli_sha)
    out = summary_lines(runs, sha)
    out += ["#### False alarms per family (clean runs)", ""] + clean_tables(runs)
    out += ["", "#### Detection and diagnosis per bug", "",
            "effect: max |E_bug - E_clean| over the output (the engine run twice on the "
            "same data), against the E-R out tolerance of the bug's report; "
            "diagnosis right: the top diagnosis is the bug at its place (replay.judge).",
            ""] + bug_tables(runs)
    out += ["", "#### Margins (clean runs: the largest share of each limit)", ""] + \
        margin_table(runs)
    return "\n".join(out) + "\n"


def write_docs(text: str, path: str = DOCS) -> None:
    with open(path) as f:
        doc = f.read()
    begin, end = "<!-- sweep:begin -->", "<!-- sweep:end -->"
    if begin not in doc or end not in doc:
        raise SystemExit(f"sweep.py: {path} has no {begin} ... {end} block")
    head, rest = doc.split(begin, 1)
    _, tail = rest.split(end, 1)
    with open(path, "w") as f:
        f.write(head + begin + "\n" + text + end + tail)


CODE_SHA = code_sha()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Realistic-scale conformance sweeps "
                                             "(module docstring).")
    ap.add_argument("--set", default="clean,bugs", help="clean, long, bugs, committed")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--only", help="comma-separated substrings of case names or families")
    ap.add_argument("--results", default=DEFAULT_RESULTS,
                    help="the results file (--tables: several, comma-separated)")
    ap.add_argument("--cli", default=os.environ.get(
        "ATTNAUDIT_CLI", os.path.join(REPO, "build", "bin", "attnaudit")))
    ap.add_argument("--budget-min", type=float, default=0.0,
                    help="stop starting runs after this many minutes (0: no limit)")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--keep", help="keep snapshots and reports of failures here")
    ap.add_argument("--tables", help="write the tables (Markdown) here and exit")
    ap.add_argument("--docs", action="store_true",
                    help="with --tables: also rewrite docs/CONFORMANCE.md's sweep block")
    ap.add_argument("--cli-sha", help="tables of this CLI (sha prefix; default: the latest; "
                                      "any: every CLI, the last record of a run winning)")
    ap.add_argument("--force", action="store_true",
                    help="rerun the selected runs even if the results file has them "
                         "(after a change to the suite that changes them)")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args(argv)
    if args.tables:
        results = [r for path in args.results.split(",") for r in load_results(path)]
        text = tables_text(results, args.cli_sha)
        with open(args.tables, "w") as f:
            f.write(text)
        if args.docs:
            write_docs(text)
        print(text)
        return 0
    if not (os.path.isfile(args.cli) and os.access(args.cli, os.X_OK)):
        print(f"sweep.py: the CLI {args.cli!r} is not an executable file", file=sys.stderr)
        return 2
    return run_sweep(args)


if __name__ == "__main__":
    sys.exit(main())
