#!/usr/bin/env python3
"""Replays the real-engine conformance fixtures through the attnaudit CLI.

For every fixture of FIXTURE_DIR/manifest.json it runs `CLI check FILE
--json` and holds the report to the manifest's expectations (the truth of
what ran, see generate.py):

  clean                      verdict PASS (INCONCLUSIVE accepted for a
                             pre-RoPE snapshot without the engine's RoPE
                             table, counted apart)
  bug, capture-bug,          verdict DRIFT ("detected"), and the top
  engine-behaviour           diagnosis is the expected hypothesis ("diagnosis
                             right"), at the expected row / logical block /
                             page where the manifest gives them

It prints a table by engine x mode x dtype (clean: PASS / total; bugs:
detected / total and diagnosis right / total) and every failure with the
observed verdict, the top-3 diagnoses and the first reasons.

Exit status: 1 if a clean run is not PASS, an injected bug is not DRIFT,
the CLI failed on a fixture, or the share of right top diagnoses is below
--min-diagnosis-rate; each diagnosis miss is reported, and fails too with
--strict-diagnosis. 2 on usage errors.

Standard library only: runs under a plain python3.

usage: replay.py FIXTURE_DIR [--cli PATH] [--table TABLE] [--json OUT]
                 [--only PATTERN] [--strict-diagnosis]
                 [--min-diagnosis-rate R] [--timeout S]
CLI: --cli, else $ATTNAUDIT_CLI, else /tmp/attnaudit-cli.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import subprocess
import sys
from collections import OrderedDict
from typing import Dict, List, Optional, Tuple

LOCATION_KEYS = ("row", "logical_block", "page")
NEAR_MISS = 0.75   # a clean run this close to a limit is listed


# ----------------------------------------------------------------------
# Reading the report (proto3 JSON, either field-name style)
# ----------------------------------------------------------------------


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.title() for p in rest)


def field(obj: Optional[dict], name: str, default=None):
    """obj[name] in snake_case or lowerCamelCase."""
    if not isinstance(obj, dict):
        return default
    if name in obj:
        return obj[name]
    return obj.get(_camel(name), default)


def verdict_name(value) -> str:
    """"PASS" from "VERDICT_PASS", "PASS" or the enum number."""
    if isinstance(value, int):
        return {0: "UNSPECIFIED", 1: "PASS", 2: "DRIFT", 3: "INVALID",
                4: "INCONCLUSIVE"}.get(value, str(value))
    return str(value or "UNSPECIFIED").replace("VERDICT_", "")


def _int(value, default: int = -1) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def diagnoses(report: dict) -> List[dict]:
    return list(field(report, "diagnoses", []) or [])


def describe_diagnosis(d: dict) -> str:
    loc = field(d, "location", {}) or {}
    where = []
    for key, short in (("row", "row"), ("logical_block", "block"), ("page", "page"),
                       ("other_page", "other page")):
        v = _int(field(loc, key))
        if v >= 0:
            where.append(f"{short} {v}")
    heads = field(loc, "heads", []) or []
    if heads:
        where.append("heads " + ",".join(str(h) for h in heads))
    score = field(d, "score", 0) or 0
    text = f"{field(d, 'hypothesis', '?')} {float(score):.2f}"
    if field(d, "explains"):
        text += " explains"
    return text + (f" ({', '.join(where)})" if where else "")


def reasons(report: dict, limit: int = 3) -> List[str]:
    """The first reasons the report gives: comparisons that are not PASS,
    then RoPE checks, then the invalid reason."""
    out = []
    for c in field(report, "comparisons", []) or []:
        if verdict_name(field(c, "verdict")) != "PASS":
            name = str(field(c, "comparison", "")).replace("COMPARISON_", "")
            out += [f"{name}: {r}" for r in field(c, "reasons", []) or []]
    for c in field(report, "rope_checks", []) or []:
        if verdict_name(field(c, "verdict")) != "PASS":
            out += [f"rope {field(c, 'what', '?')}: {r}" for r in field(c, "reasons", []) or []]
    invalid = field(report, "invalid_reason")
    if invalid:
        out.append(f"invalid: {invalid}")
    return out[:limit]


def margin(report: dict) -> Tuple[float, str]:
    """How close the engine's comparisons (E-R, E-P) came to drifting: the
    largest of max_abs / tolerance (out, lse) and rms / rms_limit of the
    statistical detector's groups, with what it was. Above 1 drifts."""
    best, what = 0.0, ""
    for c in field(report, "comparisons", []) or []:
        name = str(field(c, "comparison", "")).replace("COMPARISON_", "")
        if not name.startswith("ENGINE"):
            continue
        short = {"ENGINE_VS_REFERENCE": "E-R", "ENGINE_VS_REPLAY": "E-P",
                 "ENGINE_VS_EMULATION": "E-M"}.get(name, name)
        for q in ("out", "lse"):
            stats = field(c, q)
            tol = float(field(stats, "tolerance", 0) or 0)
            if tol > 0:
                r = float(field(stats, "max_abs", 0) or 0) / tol
                if r > best:
                    best, what = r, f"{short} {q} max_abs/tolerance"
        for g in field(field(c, "statistical"), "worst", []) or []:
            lim = float(field(g, "rms_limit", 0) or 0)
            if lim > 0:
                r = float(field(g, "rms", 0) or 0) / lim
                if r > best:
                    best, what = r, f"{short} statistical rms/limit ({field(g, 'scope', '?')})"
    return best, what


def er_out_tolerance(report: dict) -> Optional[float]:
    for c in field(report, "comparisons", []) or []:
        if str(field(c, "comparison", "")).endswith("ENGINE_VS_REFERENCE"):
            tol = field(field(c, "out"), "tolerance")
            return None if tol is None else float(tol)
    return None


# ----------------------------------------------------------------------
# Judging one fixture
# ----------------------------------------------------------------------


def run_cli(cli: str, path: str, timeout: float) -> Tuple[Optional[dict], int, str]:
    """(report or None, exit code, error text). A `.xz` file is
    decompressed to a temporary file first."""
    if path.endswith(".xz"):
        import lzma
        import tempfile
        try:
            with lzma.open(path) as src, tempfile.NamedTemporaryFile(
                    suffix=".pb", delete=False) as dst:
                dst.write(src.read())
        except (OSError, lzma.LZMAError) as e:
            return None, -1, f"cannot decompress {path}: {e}"
        try:
            return run_cli(cli, dst.name, timeout)
        finally:
            os.unlink(dst.name)
    try:
        r = subprocess.run([cli, "check", path, "--json"], capture_output=True,
                           text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, -1, f"timed out after {timeout:.0f} s"
    except OSError as e:
        return None, -1, f"cannot run {cli}: {e}"
    try:
        return json.loads(r.stdout), r.returncode, ""
    except json.JSONDecodeError:
        err = (r.stderr or r.stdout).strip().splitlines()
        return None, r.returncode, " | ".join(err[-3:]) or f"exit {r.returncode}, no JSON"


def location_matches(expected: Dict[str, int], observed: dict) -> Tuple[bool, List[str]]:
    misses = []
    for key in LOCATION_KEYS:
        if key in expected:
            got = _int(field(observed, key))
            if got != int(expected[key]):
                misses.append(f"{key} {got} != {expected[key]}")
    return not misses, misses


def judge(entry: dict, report: Optional[dict], rc: int, error: str) -> dict:
    """The outcome of one fixture against its manifest entry."""
    expect = entry["expect"]
    kind = entry["kind"]
    res = {"case": entry["case"], "engine": entry["engine"], "mode": entry["mode"],
           "dtype": entry["dtype"], "kind": kind, "bug": entry.get("bug"),
           "expect": expect, "exit_code": rc, "error": error or None}
    if report is None:
        res.update(verdict="ERROR", ok=False, detected=False, diagnosis_ok=False,
                   top=[], reasons=[error])
        return res
    verdict = verdict_name(field(report, "verdict"))
    diags = diagnoses(report)
    m, m_what = margin(report)
    res.update(verdict=verdict, top=[describe_diagnosis(d) for d in diags[:3]],
               reasons=reasons(report), margin=round(m, 4), margin_of=m_what,
               er_out_tolerance=er_out_tolerance(report))
    if kind == "clean":
        # A clean engine must PASS. Without the engine's RoPE table
        # attnaudit rotates with its own inverse frequencies: at long
        # positions a correct engine's scores are then unverifiable
        # (docs/NUMERICS.md, "RoPE tables") and the honest verdict is
        # INCONCLUSIVE; the manifest may allow more (expect.also_ok, e.g.
        # INCONCLUSIVE for an undeclared snapshot the widest envelope cannot
        # verify). Neither is a false alarm.
        unverifiable = (entry["mode"] in ("pre-q", "pre-qk")
                        and not entry.get("rope_table")
                        and verdict == "INCONCLUSIVE")
        ok = (verdict == "PASS" or unverifiable
              or verdict in (expect.get("also_ok") or []))
        res.update(ok=ok, detected=None, diagnosis_ok=None, inconclusive=unverifiable)
        return _known(entry, res)
    detected = verdict == "DRIFT"
    want = expect.get("hypothesis")
    diag_ok: Optional[bool] = None
    notes = []
    if want is not None:
        top = diags[0] if diags else None
        got = field(top, "hypothesis") if top else None
        diag_ok = detected and got == want
        if detected and got != want:
            notes.append(f"top diagnosis {got or 'none'}, expected {want}")
        if diag_ok and expect.get("location"):
            loc_ok, misses = location_matches(expect["location"], field(top, "location", {}))
            diag_ok = loc_ok
            notes += [f"location {m}" for m in misses]
        if diag_ok and expect.get("heads") is not None:   # informational
            got_heads = sorted(_int(h) for h in field(field(top, "location", {}), "heads", []) or [])
            if got_heads != sorted(expect["heads"]):
                notes.append(f"heads {got_heads} (the moved heads are {expect['heads']}; "
                             "not counted)")
    if not detected:
        notes.append(f"closest to drifting: {res['margin_of'] or '-'} at {res['margin']:.2f}"
                     f"; E-R out tolerance {res['er_out_tolerance']}")
    res.update(ok=detected, detected=detected, diagnosis_ok=diag_ok, notes=notes)
    return _known(entry, res)


def _known(entry: dict, res: dict) -> dict:
    """A manifest entry marked `known_failure` (the issue that will fix the
    auditor) does not fail the run while it fails; once it meets its
    expectation the mark is stale, and that fails the run (strict), so the
    fix removes the mark."""
    mark = entry.get("known_failure")
    if not mark:
        return res
    met = res["ok"] and res["diagnosis_ok"] is not False
    res["known_failure"] = mark
    if met:
        res["ok"] = False
        res["stale_mark"] = True
        res.setdefault("notes", []).append(
            f"marked known_failure ({mark}) but meets its expectation: remove the mark")
    else:
        res["ok"] = True
        res["diagnosis_ok"] = None if res["diagnosis_ok"] is False else res["diagnosis_ok"]
        res["known"] = True
    return res


# ----------------------------------------------------------------------
# The table
# ----------------------------------------------------------------------


def _frac(n: int, d: int) -> str:
    return f"{n}/{d}" if d else "-"


def summarize(results: List[dict]) -> "OrderedDict[Tuple[str, str, str], Dict[str, int]]":
    groups: "OrderedDict[Tuple[str, str, str], Dict[str, int]]" = OrderedDict()
    for r in sorted(results, key=lambda r: (r["engine"], r["mode"], r["dtype"])):
        g = groups.setdefault((r["engine"], r["mode"], r["dtype"]),
                              dict(clean=0, clean_pass=0, bugs=0, detected=0,
                                   diag=0, diag_right=0))
        if r["kind"] == "clean":
            g["clean"] += 1
            g["clean_pass"] += bool(r["ok"])
        else:
            g["bugs"] += 1
            g["detected"] += bool(r["detected"])
            if r["diagnosis_ok"] is not None:
                g["diag"] += 1
                g["diag_right"] += bool(r["diagnosis_ok"])
    return groups


def table_lines(results: List[dict]) -> List[str]:
    groups = summarize(results)
    lines = ["| engine | mode | dtype | clean PASS | bugs detected | diagnosis right |",
             "|---|---|---|---|---|---|"]
    tot = dict(clean=0, clean_pass=0, bugs=0, detected=0, diag=0, diag_right=0)
    for (engine, mode, dtype), g in groups.items():
        for k in tot:
            tot[k] += g[k]
        lines.append(f"| {engine} | {mode} | {dtype} | {_frac(g['clean_pass'], g['clean'])} | "
                     f"{_frac(g['detected'], g['bugs'])} | {_frac(g['diag_right'], g['diag'])} |")
    lines.append(f"| **all** | | | **{_frac(tot['clean_pass'], tot['clean'])}** | "
                 f"**{_frac(tot['detected'], tot['bugs'])}** | "
                 f"**{_frac(tot['diag_right'], tot['diag'])}** |")
    return lines


def failure_lines(results: List[dict], strict: bool) -> List[str]:
    lines = []
    for r in results:
        hard = not r["ok"]
        soft = r["diagnosis_ok"] is False
        if r.get("known"):
            lines.append(f"- known failure `{r['case']}` ({r['known_failure']}): "
                         f"expected "
                         f"{r['expect']['verdict']}, got {r['verdict']}"
                         + (f"; top {r['top'][0]}" if r.get("top") else ""))
            for reason in r["reasons"][:2]:
                lines.append(f"  - {reason[:300]}")
            continue
        if not (hard or soft):
            continue
        if hard and r["kind"] == "clean" and r.get("margin") is not None \
                and not r.get("stale_mark"):
            r = dict(r, notes=[f"worst: {r['margin_of'] or '-'} at {r['margin']:.2f}"])
        label = ("FAIL (stale known_failure mark)" if r.get("stale_mark") else
                 "FAIL" if hard else "FAIL (diagnosis)" if strict else "diagnosis miss")
        want = r["expect"].get("hypothesis")
        where = r["expect"].get("location")
        expected = r["expect"]["verdict"] + (f" {want}" if want else "") + \
            (f" at {json.dumps(where)}" if where else "")
        lines.append(f"- **{label}** `{r['case']}` ({r['kind']}"
                     f"{', ' + r['bug'] if r['bug'] else ''}): expected {expected}; "
                     f"got {r['verdict']}")
        for n in r.get("notes") or []:
            lines.append(f"  - {n}")
        if r["top"]:
            lines.append(f"  - top diagnoses: {'; '.join(r['top'])}")
        for reason in r["reasons"]:
            lines.append(f"  - {reason[:400]}")
    return lines


# ----------------------------------------------------------------------


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Replays the conformance fixtures "
                                             "through the attnaudit CLI.")
    ap.add_argument("fixtures", help="directory with manifest.json and the .pb files")
    ap.add_argument("--cli", default=os.environ.get("ATTNAUDIT_CLI", "/tmp/attnaudit-cli"))
    ap.add_argument("--table", help="also write the table and failures here (Markdown)")
    ap.add_argument("--json", help="write every fixture's outcome here")
    ap.add_argument("--only", help="fnmatch pattern or substring of case names")
    ap.add_argument("--strict-diagnosis", action="store_true",
                    help="a wrong top diagnosis (or place) fails too")
    ap.add_argument("--min-diagnosis-rate", type=float, default=0.0,
                    help="fail when fewer than this share of the bugs with a "
                         "hypothesis get the right top diagnosis (0-1)")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per fixture")
    args = ap.parse_args(argv)

    manifest_path = os.path.join(args.fixtures, "manifest.json")
    try:
        with open(manifest_path) as f:
            manifest = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        print(f"replay.py: cannot read {manifest_path}: {e}", file=sys.stderr)
        return 2
    if not (os.path.isfile(args.cli) and os.access(args.cli, os.X_OK)):
        print(f"replay.py: the CLI {args.cli!r} is not an executable file "
              "(--cli or $ATTNAUDIT_CLI)", file=sys.stderr)
        return 2
    if args.only:
        manifest = [e for e in manifest
                    if fnmatch.fnmatchcase(e["case"], args.only) or args.only in e["case"]]

    results = []
    for entry in manifest:
        path = os.path.join(args.fixtures, entry["file"])
        report, rc, error = run_cli(args.cli, path, args.timeout)
        results.append(judge(entry, report, rc, error))

    hard = [r for r in results if not r["ok"]]
    soft = [r for r in results if r["diagnosis_ok"] is False]
    known = [r for r in results if r.get("known")]
    out = ["## Real-engine conformance", "",
           f"{len(results)} fixtures, CLI `{args.cli}`", ""] + table_lines(results)
    fails = failure_lines(results, args.strict_diagnosis)
    out += ["", f"### Failures ({len(hard)} verdict, {len(soft)} diagnosis"
            f"{f', {len(known)} known' if known else ''})", ""]
    out += fails or ["none"]
    near = [r for r in results if r["kind"] == "clean" and r["ok"] and not r.get("known")
            and r.get("margin", 0) >= NEAR_MISS]
    out += ["", f"### Clean runs that passed within {NEAR_MISS:.0%} of a limit ({len(near)})", ""]
    out += [f"- `{r['case']}`: {r['margin']:.2f} ({r['margin_of']})" for r in near] or ["none"]
    text = "\n".join(out) + "\n"
    print(text)
    if args.table:
        with open(args.table, "w") as f:
            f.write(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
            f.write("\n")
    judged = [r for r in results if r["diagnosis_ok"] is not None]
    rate = (sum(1 for r in judged if r["diagnosis_ok"]) / len(judged)) if judged else 1.0
    low = rate < args.min_diagnosis_rate
    if low:
        print(f"replay.py: the top diagnosis is right for {rate:.1%} of the bugs "
              f"with a hypothesis, under --min-diagnosis-rate "
              f"{args.min_diagnosis_rate:.0%}", file=sys.stderr)
    return 1 if hard or low or (args.strict_diagnosis and soft) else 0


if __name__ == "__main__":
    sys.exit(main())
