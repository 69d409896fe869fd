"""How close clean runs of the real engines come to attnaudit's limits.

The fixtures are one draw each (seed 0). This script runs every CLEAN case
of the catalogue (cases.py, kind "clean") again over many seeds, audits
each snapshot with the CLI (`check --json`) and measures, per run, how
much of each limit the engine used:

  out, lse   max_abs / tolerance of E-R (engine vs reference), E-P (engine
             vs attnaudit's replay) and P-R (replay vs reference)
  stat       for E-R and E-P, every worst group of the statistical detector
             (scopes all / row / head): rms / rms_limit, |mean| / mean_limit,
             |bias| / mean_limit  (a group fires when (rms / rms_limit)^2,
             |mean| / mean_limit or |bias| / mean_limit exceeds 1;
             rms / rms_limit is the larger, i.e. more cautious, figure)
  stat P-R   the same for P-R (attnaudit's replay against its reference):
             not the engine's noise, but a clean run can trip it as well
  rope       every RoPE check (q, k, table): max_abs / tolerance and its
             mismatches. The report's max_abs is the largest difference of
             any element but its tolerance is the one of the element with
             the largest diff / tolerance, so this ratio is only an upper
             bound (it can exceed 1 with no mismatch); the check's verdict
             is mismatches > 0. It is shown, never counted in "max".

A verdict other than PASS is a false alarm: its case, seed and reasons are
listed. The table has one row per configuration (engine, model, dtype,
mode and the rest of the case: RoPE table, offset, layer), false alarms
first, then the tightest ("max": the largest out, lse, stat or stat P-R
ratio of any of its runs), and the largest ratio of each comparison and
quantity per engine.

The seed is CaseSpec.seed (engines/common.py): every generator of a case
is seeded from (name or engine/model/dtype, seed, salt), and the HF models'
weights from 1000 + seed. The committed fixtures are seed 0, so seed 0
reproduces them bit for bit (checked here when the fixture is present) and
seeds 1..N-1 are new data.

With --bugs it runs every case that is NOT clean (kind bug, capture-bug,
engine-behaviour) over the seeds instead and judges each run exactly as
replay.py judges a fixture (replay.judge, against the manifest entry that
generate.py would write for that seed: generate.manifest_entry, so the
truth, e.g. which page went stale, is the seed's own):

  detected     verdict DRIFT
  diag right   replay's "diagnosis right": the top diagnosis is the
               expected hypothesis, at the expected row / logical block /
               page where the truth has one (runs whose case expects a
               hypothesis; inv-freq-bf16 expects DRIFT only)
  hyp right    the top hypothesis alone (location not looked at)
  loc right    the top diagnosis's row / logical block / page equal the
               truth's, whatever its hypothesis (runs whose truth has a
               place)

It reports per bug (bug:variant), per bug x engine x mode (one row per
case: model, dtype and the rest of the case are columns), totals, and every miss
(not detected, or the diagnosis or its place wrong) with its seed, the
observed verdict, the top-3 diagnoses and a coarse cause. At seed 0 it also
checks that the snapshot and the manifest entry are the committed ones.

usage (from the repository root, in the conformance venv):
  build/conformance-venv/bin/python tests/conformance/calibrate.py \\
      [--seeds N] [--first-seed S] [--only PATTERN] [--json OUT] [--cli PATH] \\
      [--keep DIR] [--bugs [--strict]]

CLI: --cli, else $ATTNAUDIT_CLI, else build/bin/attnaudit. The CLI is
copied to a temporary directory first, so a rebuild during the run cannot
swap it mid-way. --keep DIR keeps the snapshots of false alarms (and of
runs the CLI failed on) there.

Exit status: 1 if any clean run is not PASS or a run failed (engine error,
CLI error); 0 otherwise; 2 on usage errors. With --bugs: 1 only if a run
failed (a miss is a finding, not an error), or, with --strict, also on any
miss; --keep then keeps the snapshots (and reports) of misses and failed
runs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

from cases import all_cases  # noqa: E402
from engines.common import CaseSpec, Unsupported  # noqa: E402
from generate import _driver, _matches, manifest_entry  # noqa: E402
from replay import field, reasons, verdict_name  # noqa: E402
import replay  # noqa: E402  (--bugs: judge, run_cli, the diagnosis helpers)

SHORT = {"ENGINE_VS_REFERENCE": "E-R", "ENGINE_VS_REPLAY": "E-P",
         "REPLAY_VS_REFERENCE": "P-R", "ENGINE_VS_EMULATION": "E-M"}
CLASSES = ("out", "lse", "stat", "stat P-R", "rope")
FINE = ("E-R out", "E-R lse", "E-P out", "E-P lse", "P-R out", "P-R lse",
        "E-R stat", "E-P stat", "P-R stat", "rope")
NEAR = (0.5, 0.75)   # runs whose largest ratio ("max") reaches these are counted
NOT_IN_MAX = ("rope",)  # an upper bound only (see the module docstring)


# ----------------------------------------------------------------------
# One run
# ----------------------------------------------------------------------


def variant_of(spec: CaseSpec) -> str:
    """What the case name adds to engine.model.dtype.mode (RoPE table,
    offset, layer), or "-"."""
    rest = spec.name.split(".")[4:]
    return ".".join(rest) or "-"


def _ratio(num, den) -> Optional[float]:
    num = abs(float(num or 0.0))
    den = float(den or 0.0)
    if den > 0:
        return num / den
    return 0.0 if num == 0 else math.inf


def ratios_of(report: dict) -> Tuple[Dict[str, float], int]:
    """Every ratio of a report, by name ("E-R out", "E-P stat rms (row)",
    "rope q", ...), and the RoPE checks' total mismatches."""
    out: Dict[str, float] = {}

    def put(key: str, value: Optional[float]) -> None:
        if value is not None:
            out[key] = max(out.get(key, 0.0), value)

    for c in field(report, "comparisons", []) or []:
        name = str(field(c, "comparison", "")).replace("COMPARISON_", "")
        short = SHORT.get(name, name)
        for q in ("out", "lse"):
            stats = field(c, q)
            if stats:
                put(f"{short} {q}", _ratio(field(stats, "max_abs"), field(stats, "tolerance")))
        stat = field(c, "statistical")
        for g in (field(stat, "worst", []) or []):
            scope = field(g, "scope", "?")
            ml = field(g, "mean_limit")
            put(f"{short} stat rms ({scope})", _ratio(field(g, "rms"), field(g, "rms_limit")))
            put(f"{short} stat mean ({scope})", _ratio(field(g, "mean"), ml))
            put(f"{short} stat bias ({scope})", _ratio(field(g, "bias"), ml))
    mismatches = 0
    for r in field(report, "rope_checks", []) or []:
        put(f"rope {field(r, 'what', '?')}",
            _ratio(field(r, "max_abs"), field(r, "tolerance")))
        mismatches += int(field(r, "mismatches", 0) or 0)
    return out, mismatches


def class_of(key: str) -> str:
    """The table's class of a ratio key: out, lse (E-R, E-P and P-R), stat
    (E-R and E-P statistical groups), stat P-R (the replay's own
    statistical groups: a clean run can trip them too) or rope."""
    if key.startswith("rope "):
        return "rope"
    if " stat " in key:
        return "stat P-R" if key.startswith("P-R") else "stat"
    return key.split(" ")[1]          # out | lse


def fine_class_of(key: str) -> str:
    """The per-engine table's class: the comparison and the quantity
    ("E-R out", "E-P stat", ...), or rope."""
    if key.startswith("rope "):
        return "rope"
    short, what = key.split(" ")[:2]
    return f"{short} {what}"


def run_cli(cli: str, path: str, timeout: float) -> Tuple[Optional[dict], str]:
    try:
        r = subprocess.run([cli, "check", path, "--json"], capture_output=True,
                           text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"CLI timed out after {timeout:.0f} s"
    except OSError as e:
        return None, f"cannot run {cli}: {e}"
    try:
        return json.loads(r.stdout), ""
    except json.JSONDecodeError:
        err = (r.stderr or r.stdout).strip().splitlines()
        return None, " | ".join(err[-3:]) or f"exit {r.returncode}, no JSON"


def _sha(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def one_run(spec: CaseSpec, cli: str, tmp: str, timeout: float,
            keep: Optional[str]) -> dict:
    base = {"case": spec.name, "seed": spec.seed, "engine": spec.engine,
            "model": spec.model, "dtype": spec.dtype, "mode": spec.mode,
            "variant": variant_of(spec)}
    try:
        cap = _driver(spec.engine).capture(spec)
        path = os.path.join(tmp, f"{spec.name}.s{spec.seed}.pb")
        cap.snapshot().save(path)
    except Unsupported as e:
        return {**base, "status": "unsupported", "reasons": [str(e)]}
    except Exception:  # noqa: BLE001 - report every broken run
        return {**base, "status": "error",
                "reasons": traceback.format_exc().strip().splitlines()[-3:]}
    fixture_same = None
    if spec.seed == 0:
        fixture = os.path.join(HERE, "fixtures", spec.name + ".pb")
        if os.path.exists(fixture):
            with open(fixture, "rb") as a, open(path, "rb") as b:
                fixture_same = a.read() == b.read()
    report, error = run_cli(cli, path, timeout)
    if report is None:
        res = {**base, "status": "error", "reasons": [error]}
    else:
        verdict = verdict_name(field(report, "verdict"))
        ratios, mismatches = ratios_of(report)
        res = {**base, "status": "ok", "verdict": verdict, "ratios": ratios,
               "rope_mismatches": mismatches,
               "reasons": reasons(report, limit=20) if verdict != "PASS" else []}
    if fixture_same is not None:
        res["fixture_identical"] = fixture_same
    bad = res["status"] == "error" or res.get("verdict", "PASS") != "PASS"
    if keep and bad:
        os.makedirs(keep, exist_ok=True)
        shutil.copy(path, os.path.join(keep, os.path.basename(path)))
    os.unlink(path)
    return res


# ----------------------------------------------------------------------
# The table
# ----------------------------------------------------------------------


def _empty_group(classes) -> dict:
    return {"runs": 0, "false_alarms": 0, "errors": 0, "unsupported": 0,
            "rope_mismatches": 0, "near": [0] * len(NEAR),
            **{c: (0.0, "", None) for c in classes}, "max": (0.0, "", None)}


def _bump(g: dict, cls: str, value: float, key: str, seed: int) -> None:
    if value > g[cls][0] or not g[cls][1]:
        g[cls] = (value, key, seed)


def aggregate(runs: List[dict], key_fn, cls_fn=class_of,
              classes=CLASSES) -> "Dict[tuple, dict]":
    """Per group: run counts and, per class and overall, (largest ratio,
    its key, its seed)."""
    groups: Dict[tuple, dict] = {}
    for r in runs:
        g = groups.setdefault(key_fn(r), _empty_group(classes))
        if r["status"] == "unsupported":
            g["unsupported"] += 1
            continue
        if r["status"] == "error":
            g["errors"] += 1
            continue
        g["runs"] += 1
        g["false_alarms"] += r["verdict"] != "PASS"
        g["rope_mismatches"] += r["rope_mismatches"]
        top = 0.0
        for key, value in r["ratios"].items():
            cls = cls_fn(key)
            _bump(g, cls, value, key, r["seed"])
            if cls not in NOT_IN_MAX:
                _bump(g, "max", value, key, r["seed"])
                top = max(top, value)
        for i, t in enumerate(NEAR):
            g["near"][i] += top >= t
    return groups


def _cell(v: Tuple[float, str, Optional[int]], with_key: bool = True) -> str:
    value, key, _ = v
    if not key:
        return "-"
    text = "inf" if math.isinf(value) else f"{value:.3f}"
    if with_key:
        text += f" {key.replace(' stat ', ' ')}"
    return text


def config_table(runs: List[dict]) -> List[str]:
    groups = aggregate(runs, lambda r: (r["engine"], r["model"], r["dtype"], r["mode"],
                                        r["variant"]))
    rows = sorted(groups.items(), key=lambda kv: (-kv[1]["false_alarms"], -kv[1]["errors"],
                                                  -kv[1]["max"][0], kv[0]))
    lines = ["| # | engine | model | dtype | mode | variant | runs | false alarms | "
             "out | lse | stat | stat P-R | rope (bound) | max (seed) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for i, ((engine, model, dtype, mode, variant), g) in enumerate(rows, 1):
        runs_text = str(g["runs"]) + (f" (+{g['errors']} err)" if g["errors"] else "") + \
            (f" (+{g['unsupported']} unsup)" if g["unsupported"] else "")
        rope = "-" if not g["rope"][1] else \
            f"<={_cell(g['rope'])}, {g['rope_mismatches']} mism."
        mx = g["max"]
        max_text = "-" if not mx[1] else f"{_cell(mx, False)} ({mx[2]})"
        lines.append(f"| {i} | {engine} | {model} | {dtype} | {mode} | {variant} | {runs_text} | "
                     f"{g['false_alarms']} | {_cell(g['out'])} | {_cell(g['lse'])} | "
                     f"{_cell(g['stat'])} | {_cell(g['stat P-R'])} | {rope} | {max_text} |")
    return lines


def engine_table(runs: List[dict]) -> List[str]:
    """Per engine (and all): counts and the largest ratio of each comparison
    and quantity."""
    def agg(key_fn):
        return aggregate(runs, key_fn, fine_class_of, FINE)
    groups = sorted(agg(lambda r: (r["engine"],)).items())
    groups.append((("**all**",), agg(lambda r: ("all",))[("all",)]))
    lines = ["| engine | runs | false alarms | errors | " +
             " | ".join(c if c != "rope" else "rope (bound) | rope mism." for c in FINE) +
             f" | max | runs >= {NEAR[0]} | runs >= {NEAR[1]} |",
             "|---" * (8 + len(FINE)) + "|"]
    for (name,), g in groups:
        lines.append(f"| {name} | {g['runs']} | {g['false_alarms']} | {g['errors']} | " +
                     " | ".join(_cell(g[c], False) if c != "rope" else
                                f"{_cell(g[c], False)} | {g['rope_mismatches']}"
                                for c in FINE) +
                     f" | {_cell(g['max'])} | {g['near'][0]} | {g['near'][1]} |")
    return lines


def argmax_lines(runs: List[dict]) -> List[str]:
    """Which run holds each engine's maximum of each class."""
    lines = []
    for engine in sorted({r["engine"] for r in runs}):
        for cls in FINE:
            best = None
            for r in runs:
                if r["engine"] != engine or r["status"] != "ok":
                    continue
                for key, value in r["ratios"].items():
                    if fine_class_of(key) == cls and (best is None or value > best[0]):
                        best = (value, key, r["case"], r["seed"])
            if best:
                bound = " (an upper bound)" if cls in NOT_IN_MAX else ""
                lines.append(f"- {engine} {cls}: {best[0]:.3f}{bound} ({best[1]}) in "
                             f"`{best[2]}` seed {best[3]}")
    return lines


def stat_fire_line(runs: List[dict]) -> str:
    """The statistical detector's own firing figure: max over every group
    (E-R, E-P, P-R) of max((rms/rms_limit)^2, |mean|/mean_limit,
    |bias|/mean_limit)."""
    best = (0.0, "", "", -1)
    for r in runs:
        if r["status"] != "ok":
            continue
        for key, value in r["ratios"].items():
            if " stat " not in key:
                continue
            v = value * value if " rms " in key else value
            if v > best[0]:
                best = (v, key, r["case"], r["seed"])
    if not best[1]:
        return "statistical firing figure: -"
    return (f"statistical firing figure (rms ratio squared, as the detector compares): "
            f"max {best[0]:.3f} ({best[1]}) in `{best[2]}` seed {best[3]}")


# ----------------------------------------------------------------------
# --bugs: the non-clean cases over many seeds, judged as replay.py does
# ----------------------------------------------------------------------

BUG_KINDS = ("bug", "capture-bug", "engine-behaviour")


def bug_label(spec: CaseSpec) -> str:
    """bug[:variant] ("seq-len-off-by-one:+1", "stale-page")."""
    return (spec.bug or "?") + (f":{spec.variant}" if spec.variant else "")


def rest_of(spec: CaseSpec) -> str:
    """What a non-clean case name adds after its bug (layer, RoPE table,
    offset), or "-"."""
    return ".".join(spec.name.split(".")[5:]) or "-"


def _committed_manifest() -> Dict[str, dict]:
    path = os.path.join(HERE, "fixtures", "manifest.json")
    try:
        with open(path) as f:
            return {e["case"]: e for e in json.load(f)}
    except (OSError, json.JSONDecodeError, KeyError, TypeError):
        return {}


def _cause(res: dict, diags: List[dict], want: Optional[str], got: Optional[str],
           loc_misses: List[str]) -> Tuple[str, str]:
    """(class, text) of a miss: not detected, a competing hypothesis on
    top, or the right hypothesis at the wrong place."""
    if not res["detected"]:
        return f"not detected ({res['verdict']})", \
            f"not detected: {res['verdict']}, closest {res.get('margin_of') or '-'} " \
            f"at {res.get('margin', 0):.2f}"
    if want is not None and got != want:
        rank = next((i for i, d in enumerate(diags, 1)
                     if field(d, "hypothesis") == want), None)
        where = (f"{want} ranked {rank}: {replay.describe_diagnosis(diags[rank - 1])}"
                 if rank else f"{want} not among the {len(diags)} diagnoses")
        return f"top diagnosis {got or 'none'}", f"top diagnosis {got or 'none'} ({where})"
    if loc_misses:
        return "location " + ", ".join(m.split(" ")[0] for m in loc_misses), \
            "location " + "; ".join(loc_misses)
    return "other", "other"


def bug_run(spec: CaseSpec, cli: str, tmp: str, timeout: float, keep: Optional[str],
            committed: Dict[str, dict]) -> dict:
    """One non-clean case at one seed: capture, audit, replay.judge."""
    base = {"case": spec.name, "seed": spec.seed, "engine": spec.engine,
            "model": spec.model, "dtype": spec.dtype, "mode": spec.mode,
            "kind": spec.kind, "bug": bug_label(spec), "rest": rest_of(spec)}
    path = os.path.join(tmp, spec.name + ".pb")   # the manifest's "file", as generate.py
    try:
        cap = _driver(spec.engine).capture(spec)
        cap.snapshot().save(path)
        entry = manifest_entry(spec, cap, path)
    except Unsupported as e:
        return {**base, "status": "unsupported", "reasons": [str(e)]}
    except Exception:  # noqa: BLE001 - report every broken run
        if os.path.exists(path):
            os.unlink(path)
        return {**base, "status": "error",
                "reasons": traceback.format_exc().strip().splitlines()[-3:]}
    base["expect"] = entry["expect"]
    if spec.seed == 0 and spec.name in committed:
        fixture = os.path.join(HERE, "fixtures", spec.name + ".pb")
        if os.path.exists(fixture):
            with open(fixture, "rb") as a, open(path, "rb") as b:
                base["fixture_identical"] = a.read() == b.read()
        def bare(e):      # the producing host is not part of the case
            return {**e, "info": {k: v for k, v in e.get("info", {}).items() if k != "host"}}
        base["entry_identical"] = bare(entry) == bare(committed[spec.name])
    report, rc, error = replay.run_cli(cli, path, timeout)
    j = replay.judge(entry, report, rc, error)
    if report is None:
        res = {**base, "status": "error", "reasons": [f"CLI: {error}"]}
    else:
        diags = replay.diagnoses(report)
        top = diags[0] if diags else None
        want = entry["expect"].get("hypothesis")
        got = field(top, "hypothesis") if top else None
        detected = bool(j["detected"])
        hyp_ok = None if want is None else (detected and got == want)
        loc_ok, loc_misses = None, []
        if entry["expect"].get("location"):
            if detected and top is not None:
                loc_ok, loc_misses = replay.location_matches(
                    entry["expect"]["location"], field(top, "location", {}) or {})
            else:
                loc_ok = False
        res = {**base, "status": "ok", "verdict": j["verdict"], "detected": detected,
               "diagnosis_ok": j["diagnosis_ok"], "hyp_ok": hyp_ok, "loc_ok": loc_ok,
               "top": j["top"], "notes": j.get("notes") or [], "reasons": j["reasons"],
               "margin": j.get("margin"), "margin_of": j.get("margin_of")}
        res["miss"] = (not detected) or j["diagnosis_ok"] is False or loc_ok is False
        if res["miss"]:
            res["cause_class"], res["cause"] = _cause(res, diags, want, got, loc_misses)
            res["reasons"] = reasons(report, limit=4)
    if keep and (res["status"] == "error" or res.get("miss")):
        os.makedirs(keep, exist_ok=True)
        stem = os.path.join(keep, f"{spec.name}.s{spec.seed}")
        shutil.copy(path, stem + ".pb")
        if report is not None:
            with open(stem + ".json", "w") as f:
                json.dump(report, f, indent=1)
    os.unlink(path)
    return res


def _tally(runs: List[dict]) -> dict:
    ok = [r for r in runs if r["status"] == "ok"]

    def count(key):
        judged = [r for r in ok if r[key] is not None]
        return sum(bool(r[key]) for r in judged), len(judged)
    return {"runs": len(ok), "errors": sum(r["status"] == "error" for r in runs),
            "unsupported": sum(r["status"] == "unsupported" for r in runs),
            "detected": (sum(r["detected"] for r in ok), len(ok)),
            "diag": count("diagnosis_ok"), "hyp": count("hyp_ok"), "loc": count("loc_ok"),
            "misses": [r for r in ok if r["miss"]],
            "cases": len({r["case"] for r in runs})}


def _rate(nd: Tuple[int, int]) -> str:
    n, d = nd
    return f"{n}/{d} ({100.0 * n / d:.0f}%)" if d else "-"


def _runs_text(t: dict) -> str:
    return str(t["runs"]) + (f" (+{t['errors']} err)" if t["errors"] else "") + \
        (f" (+{t['unsupported']} unsup)" if t["unsupported"] else "")


def bug_tables(runs: List[dict]) -> Tuple[List[str], List[str]]:
    """(per bug, per bug x engine x mode: one row per case)."""
    by_bug: Dict[tuple, List[dict]] = {}
    by_case: Dict[tuple, List[dict]] = {}
    for r in runs:
        by_bug.setdefault((r["bug"], r["kind"]), []).append(r)
        by_case.setdefault((r["bug"], r["engine"], r["model"], r["mode"], r["dtype"],
                            r["rest"]), []).append(r)
    per_bug = ["| bug | kind | cases | runs | detected | diagnosis right | hypothesis right | "
               "location right | misses |", "|---|---|---|---|---|---|---|---|---|"]
    for (bug, kind), rs in sorted(by_bug.items()):
        t = _tally(rs)
        per_bug.append(f"| {bug} | {kind} | {t['cases']} | {_runs_text(t)} | "
                       f"{_rate(t['detected'])} | {_rate(t['diag'])} | {_rate(t['hyp'])} | "
                       f"{_rate(t['loc'])} | {len(t['misses'])} |")
    per_case = ["| bug | engine | model | mode | dtype | rest | runs | detected | "
                "diagnosis right | location right | missed seeds |",
                "|---|---|---|---|---|---|---|---|---|---|---|"]
    for (bug, engine, model, mode, dtype, rest), rs in sorted(by_case.items()):
        t = _tally(rs)
        seeds = ", ".join(str(r["seed"]) for r in t["misses"]) or "-"
        per_case.append(f"| {bug} | {engine} | {model} | {mode} | {dtype} | {rest} | "
                        f"{_runs_text(t)} | "
                        f"{_rate(t['detected'])} | {_rate(t['diag'])} | {_rate(t['loc'])} | "
                        f"{seeds} |")
    return per_bug, per_case


def total_lines(runs: List[dict]) -> List[str]:
    t = _tally(runs)
    lines = [f"- detection (verdict DRIFT) over all bug runs: **{_rate(t['detected'])}**",
             f"- diagnosis right (replay.judge) over the runs whose case expects a "
             f"hypothesis: **{_rate(t['diag'])}**",
             f"- top hypothesis right (place not looked at): {_rate(t['hyp'])}",
             f"- location right over the runs whose truth has a place: {_rate(t['loc'])}",
             f"- misses: {len(t['misses'])}; errors: {t['errors']}; "
             f"unsupported: {t['unsupported']}", "",
             "| kind | runs | detected | diagnosis right | location right |",
             "|---|---|---|---|---|"]
    for kind in BUG_KINDS:
        k = _tally([r for r in runs if r["kind"] == kind])
        if k["runs"] or k["errors"] or k["unsupported"]:
            lines.append(f"| {kind} | {_runs_text(k)} | {_rate(k['detected'])} | "
                         f"{_rate(k['diag'])} | {_rate(k['loc'])} |")
    lines += ["", "| engine | runs | detected | diagnosis right | location right |",
              "|---|---|---|---|---|"]
    for engine in sorted({r["engine"] for r in runs}):
        k = _tally([r for r in runs if r["engine"] == engine])
        lines.append(f"| {engine} | {_runs_text(k)} | {_rate(k['detected'])} | "
                     f"{_rate(k['diag'])} | {_rate(k['loc'])} |")
    return lines


def miss_lines(runs: List[dict]) -> List[str]:
    misses = [r for r in runs if r["status"] == "ok" and r["miss"]]
    if not misses:
        return ["none"]
    causes: Dict[str, List[dict]] = {}
    for r in misses:
        causes.setdefault(r["cause_class"], []).append(r)
    lines = ["By coarse cause (the class of the first thing that went wrong):", ""]
    for cls, rs in sorted(causes.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        per_case: Dict[str, List[int]] = {}
        for r in rs:
            per_case.setdefault(r["case"], []).append(r["seed"])
        lines.append(f"- {cls}: {len(rs)} - " + "; ".join(
            f"`{c}` seeds {','.join(map(str, s))}" for c, s in per_case.items()))
    lines += ["", "Every miss:", ""]
    for r in sorted(misses, key=lambda r: (r["bug"], r["case"], r["seed"])):
        e = r["expect"]
        want = e["verdict"] + (f" {e['hypothesis']}" if e.get("hypothesis") else "") + \
            (f" at {json.dumps(e['location'])}" if e.get("location") else "")
        lines.append(f"- `{r['case']}` seed {r['seed']}: got {r['verdict']}, expected {want}"
                     f" - {r['cause']}")
        lines.append(f"  - top-3: {'; '.join(r['top']) or 'none'}")
        for n in r["notes"]:
            lines.append(f"  - {n}")
        for reason in r["reasons"][:3]:
            lines.append(f"  - {reason[:300]}")
    return lines


def main_bugs(args) -> int:
    cases = [c for c in all_cases() if c.kind in BUG_KINDS
             and (not args.only or _matches(c.name, args.only))]
    if not cases:
        print(f"calibrate.py: no non-clean case matches {args.only!r}", file=sys.stderr)
        return 2
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    committed = _committed_manifest()

    import torch
    torch.set_num_threads(1)

    runs: List[dict] = []
    t_all = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="attnaudit-calibrate-") as tmp:
        cli = os.path.join(tmp, "attnaudit")
        shutil.copy2(args.cli, cli)      # a rebuild mid-run cannot swap it
        cli_sha = _sha(cli)
        cli_mtime = time.strftime("%Y-%m-%d %H:%M:%S",
                                  time.localtime(os.path.getmtime(args.cli)))
        work = os.path.join(tmp, "runs")
        os.makedirs(work)
        print(f"calibrate.py --bugs: {len(cases)} non-clean cases x {len(seeds)} seeds "
              f"({seeds[0]}..{seeds[-1]}), CLI {args.cli} ({cli_mtime}, "
              f"sha256 {cli_sha[:12]})", flush=True)
        for seed in seeds:       # seed outer: HF's cached models are reused per seed
            t_seed = time.perf_counter()
            for spec in cases:
                res = bug_run(spec.replace(seed=seed), cli, work, args.timeout, args.keep,
                              committed)
                runs.append(res)
                if res["status"] == "error":
                    print(f"  ERROR {spec.name} seed {seed}: {' | '.join(res['reasons'])}",
                          file=sys.stderr, flush=True)
                elif res.get("miss"):
                    print(f"  MISS {spec.name} seed {seed}: {res['cause']}", flush=True)
            t = _tally([r for r in runs if r["seed"] == seed])
            print(f"seed {seed:3d}: {t['runs']} runs, detected {_rate(t['detected'])}, "
                  f"diagnosis right {_rate(t['diag'])}, {len(t['misses'])} misses, "
                  f"{t['errors']} errors, {time.perf_counter() - t_seed:.1f} s", flush=True)
    elapsed = time.perf_counter() - t_all

    errors = [r for r in runs if r["status"] == "error"]
    misses = [r for r in runs if r["status"] == "ok" and r["miss"]]
    per_bug, per_case = bug_tables(runs)
    totals = total_lines(runs)
    out = ["## Bug-run calibration", "",
           f"{len(cases)} non-clean cases x {len(seeds)} seeds = {len(runs)} runs "
           f"in {elapsed:.1f} s; CLI {args.cli} (sha256 {cli_sha[:12]}, {cli_mtime})", ""]
    same = [r for r in runs if "entry_identical" in r]
    if same:
        n_fix = sum(bool(r.get("fixture_identical")) for r in same)
        n_ent = sum(r["entry_identical"] for r in same)
        out += [f"seed 0 reproduces the committed fixture bit for bit: {n_fix}/{len(same)}; "
                f"its manifest entry (expectation included): {n_ent}/{len(same)}", ""]
    out += ["Judged as replay.py judges a fixture, against the manifest entry generate.py "
            "writes for the seed. Diagnosis right: the top diagnosis is the expected "
            "hypothesis at the expected row / logical block / page (runs whose case expects "
            "a hypothesis); hypothesis right: the hypothesis alone; location right: the top "
            "diagnosis's place, whatever its hypothesis (runs whose truth has a place).", "",
            "### Totals", ""] + totals
    out += ["", "### Per bug", ""] + per_bug
    out += ["", "### Per bug x engine x mode (one row per case)", ""] + per_case
    out += ["", f"### Misses ({len(misses)})", ""] + miss_lines(runs)
    if errors:
        out += ["", f"### Errors ({len(errors)})", ""]
        out += [f"- `{r['case']}` seed {r['seed']}: {' | '.join(r['reasons'])}" for r in errors]
    text = "\n".join(out) + "\n"
    print("\n" + text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"mode": "bugs", "cases": len(cases), "seeds": seeds, "cli": args.cli,
                       "cli_sha256": cli_sha, "elapsed_s": round(elapsed, 2),
                       "totals": totals, "per_bug": per_bug, "per_case": per_case,
                       "misses": misses, "errors": errors, "runs": runs}, f, indent=1)
            f.write("\n")
    return 1 if errors or (args.strict and misses) else 0


# ----------------------------------------------------------------------


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Measures how close clean real-engine runs "
                                             "come to attnaudit's limits over many seeds "
                                             "(see the module docstring).")
    ap.add_argument("--seeds", type=int, default=20, help="seeds per case (default 20)")
    ap.add_argument("--first-seed", type=int, default=0,
                    help="first seed (default 0: the committed fixtures' data)")
    ap.add_argument("--only", help="fnmatch pattern or substring of case names")
    ap.add_argument("--json", help="write every run and the tables here")
    ap.add_argument("--cli", default=os.environ.get(
        "ATTNAUDIT_CLI", os.path.join(REPO, "build", "bin", "attnaudit")))
    ap.add_argument("--keep", help="keep the snapshots of false alarms and failed runs here")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per CLI call")
    ap.add_argument("--bugs", action="store_true",
                    help="run the non-clean cases (bug, capture-bug, engine-behaviour) "
                         "instead and judge them as replay.py does")
    ap.add_argument("--strict", action="store_true",
                    help="with --bugs: exit 1 on any miss too")
    args = ap.parse_args(argv)

    if args.seeds < 1:
        print("calibrate.py: --seeds must be at least 1", file=sys.stderr)
        return 2
    if args.strict and not args.bugs:
        print("calibrate.py: --strict goes with --bugs", file=sys.stderr)
        return 2
    if not (os.path.isfile(args.cli) and os.access(args.cli, os.X_OK)):
        print(f"calibrate.py: the CLI {args.cli!r} is not an executable file "
              "(--cli or $ATTNAUDIT_CLI)", file=sys.stderr)
        return 2
    if args.bugs:
        return main_bugs(args)
    cases = [c for c in all_cases() if c.kind == "clean"
             and (not args.only or _matches(c.name, args.only))]
    if not cases:
        print(f"calibrate.py: no clean case matches {args.only!r}", file=sys.stderr)
        return 2
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))

    import torch
    torch.set_num_threads(1)

    runs: List[dict] = []
    t_all = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="attnaudit-calibrate-") as tmp:
        cli = os.path.join(tmp, "attnaudit")
        shutil.copy2(args.cli, cli)      # a rebuild mid-run cannot swap it
        cli_sha = _sha(cli)
        cli_mtime = time.strftime("%Y-%m-%d %H:%M:%S",
                                  time.localtime(os.path.getmtime(args.cli)))
        print(f"calibrate.py: {len(cases)} clean cases x {len(seeds)} seeds "
              f"({seeds[0]}..{seeds[-1]}), CLI {args.cli} ({cli_mtime}, "
              f"sha256 {cli_sha[:12]})", flush=True)
        for seed in seeds:       # seed outer: HF's cached models are reused per seed
            t_seed = time.perf_counter()
            fa = 0
            for spec in cases:
                res = one_run(spec.replace(seed=seed), cli, tmp, args.timeout, args.keep)
                runs.append(res)
                if res["status"] == "error":
                    print(f"  ERROR {spec.name} seed {seed}: {' | '.join(res['reasons'])}",
                          file=sys.stderr, flush=True)
                elif res.get("verdict", "PASS") != "PASS":
                    fa += 1
                    print(f"  FALSE ALARM {spec.name} seed {seed}: {res['verdict']}: "
                          f"{' | '.join(res['reasons'][:3])}", flush=True)
            done = [r for r in runs if r["seed"] == seed and r["status"] == "ok"]
            top = max((v for r in done for k, v in r["ratios"].items()
                       if class_of(k) not in NOT_IN_MAX), default=0.0)
            print(f"seed {seed:3d}: {len(done)} runs, {fa} false alarms, largest ratio "
                  f"{top:.3f}, {time.perf_counter() - t_seed:.1f} s", flush=True)
    elapsed = time.perf_counter() - t_all

    ok = [r for r in runs if r["status"] == "ok"]
    alarms = [r for r in ok if r["verdict"] != "PASS"]
    errors = [r for r in runs if r["status"] == "error"]
    unsupported = [r for r in runs if r["status"] == "unsupported"]
    same = [r for r in runs if "fixture_identical" in r]
    cfg = config_table(runs)
    eng = engine_table(runs)
    out = ["## Clean-run calibration", "",
           f"{len(cases)} clean cases x {len(seeds)} seeds = {len(runs)} runs "
           f"({len(ok)} audited, {len(errors)} errors, {len(unsupported)} unsupported) "
           f"in {elapsed:.1f} s; CLI {args.cli} (sha256 {cli_sha[:12]}, {cli_mtime})", ""]
    if same:
        n_same = sum(r["fixture_identical"] for r in same)
        out += [f"seed 0 reproduces the committed fixture bit for bit: {n_same}/{len(same)}",
                ""]
    out += ["Ratios are max_abs / tolerance (out, lse: E-R, E-P, P-R; rope: q, k, table) "
            "and, for the statistical worst groups (stat: E-R and E-P; stat P-R: the "
            "replay's), rms / rms_limit, |mean| / mean_limit, |bias| / mean_limit. "
            "Above 1 is over a limit.", "",
            "### Per engine", ""] + eng + ["", stat_fire_line(runs), ""]
    out += ["### Where each engine maximum is", ""] + argmax_lines(runs)
    out += ["", "### Per configuration (tightest first)", ""] + cfg
    out += ["", f"### False alarms ({len(alarms)})", ""]
    for r in alarms:
        out.append(f"- `{r['case']}` seed {r['seed']}: {r['verdict']}")
        out += [f"  - {reason[:500]}" for reason in r["reasons"]]
    if not alarms:
        out.append("none")
    if errors:
        out += ["", f"### Errors ({len(errors)})", ""]
        out += [f"- `{r['case']}` seed {r['seed']}: {' | '.join(r['reasons'])}" for r in errors]
    text = "\n".join(out) + "\n"
    print("\n" + text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cases": len(cases), "seeds": seeds, "cli": args.cli,
                       "cli_sha256": cli_sha, "elapsed_s": round(elapsed, 2),
                       "false_alarms": [{k: r[k] for k in ("case", "seed", "verdict",
                                                           "reasons")} for r in alarms],
                       "errors": errors, "table": cfg, "engines": eng, "runs": runs},
                      f, indent=1)
            f.write("\n")
    return 1 if alarms or errors else 0


if __name__ == "__main__":
    sys.exit(main())
