"""Generates the real-engine conformance fixtures.

Runs every case of cases.py on the real engine code (vLLM's CPU kernels,
Hugging Face transformers, torch's CPU flash attention), writes one
snapshot file per case, `<out>/<case>.pb`, and `<out>/manifest.json`: a
list of

  {"case", "engine", "model", "mode", "dtype", "kind", "bug", "variant",
   "layer", "rope_table", "file", "bytes", "note",
   "expect": {"verdict": "PASS" | "DRIFT", "hypothesis": name or null,
              "location": {"row", "logical_block", "page"}  (where the bug has one),
              "heads": [...]  (gqa-mapping: the query heads that move; informational)},
   "info": {...engine facts: isa, kv_cache_dtype, offsets, ...}}

Expectations are the truth of what was injected, never what attnaudit
answers today. Cases an engine cannot run are listed in
`<out>/unsupported.json` (with the reason) instead.

Everything is seeded from the case (engines/common.py), so regeneration is
reproducible bit for bit on the same versions (requirements.txt).

usage (from the repository root, in the conformance venv):
  build/conformance-venv/bin/python tests/conformance/generate.py \\
      [--out tests/conformance/fixtures] [--only PATTERN] [--list]

PATTERN is an fnmatch pattern or a substring of case names; with --only
the manifest keeps the other cases' entries.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from cases import all_cases  # noqa: E402
from engines.common import CaseSpec, Unsupported  # noqa: E402

DRIVERS = {"vllm-cpu": "vllm_cpu", "hf-eager": "hf", "hf-sdpa": "hf",
           "torch-flash-cpu": "torch_flash"}


def _driver(engine: str):
    import importlib
    return importlib.import_module(f"engines.{DRIVERS[engine]}")


def _matches(name: str, pattern: str) -> bool:
    return fnmatch.fnmatchcase(name, pattern) or pattern in name


def expectation(spec: CaseSpec, location) -> dict:
    """The truth: clean -> PASS; anything injected or found -> DRIFT with
    its hypothesis and, where it has one, its place."""
    if spec.kind == "clean":
        return {"verdict": "PASS", "hypothesis": None}
    out = {"verdict": "DRIFT", "hypothesis": spec.expected_hypothesis}
    if location:
        where = {k: int(location[k]) for k in ("row", "logical_block", "page")
                 if k in location}
        if where:
            out["location"] = where
        if "heads" in location:
            out["heads"] = [int(h) for h in location["heads"]]
    return out


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    return str(x)


def manifest_entry(spec: CaseSpec, cap, path: str) -> dict:
    """The manifest entry of a case whose capture `cap` was saved at
    `path` (calibrate.py --bugs builds the same entry for other seeds).
    info.host: the CPU that produced it (vLLM's CPU arithmetic depends on
    its ISA: bf16 narrowing, fp8)."""
    from engines.realistic import host
    cap.info.setdefault("host", host())
    return {
        "case": spec.name, "engine": spec.engine, "model": spec.model,
        "mode": spec.mode, "dtype": spec.dtype, "kind": spec.kind, "bug": spec.bug,
        "variant": spec.variant, "layer": spec.layer, "rope_table": spec.rope_table,
        "file": os.path.basename(path), "bytes": os.path.getsize(path), "note": spec.note,
        "expect": expectation(spec, cap.location), "info": _jsonable(cap.info),
    }


def run_case(spec: CaseSpec, out_dir: str) -> dict:
    """Runs one case and writes its snapshot; returns its manifest entry."""
    cap = _driver(spec.engine).capture(spec)
    snap = cap.snapshot()
    path = os.path.join(out_dir, spec.name + ".pb")
    snap.save(path)
    return manifest_entry(spec, cap, path)


def _load(path: str):
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    return []


def _write_json(path: str, data) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, sort_keys=False)
        f.write("\n")
    os.replace(tmp, path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Generates the real-engine conformance "
                                             "fixtures (see the module docstring).")
    ap.add_argument("--out", default=os.path.join(HERE, "fixtures"))
    ap.add_argument("--only", help="fnmatch pattern or substring of case names")
    ap.add_argument("--list", action="store_true", help="list the cases and exit")
    args = ap.parse_args(argv)

    cases = all_cases()
    selected = [c for c in cases if not args.only or _matches(c.name, args.only)]
    if args.list:
        for c in selected:
            print(f"{c.name:70s} {c.kind:16s} {c.expected_hypothesis or ''}")
        return 0
    if not selected:
        print(f"generate.py: no case matches {args.only!r}", file=sys.stderr)
        return 2

    import torch
    torch.set_num_threads(1)
    os.makedirs(args.out, exist_ok=True)
    manifest_path = os.path.join(args.out, "manifest.json")
    unsupported_path = os.path.join(args.out, "unsupported.json")
    committed = {e["case"]: e for e in _load(manifest_path)}
    old = committed if args.only else {}
    old_unsupported = ({e["case"]: e for e in _load(unsupported_path)}
                       if args.only else {})
    entries, unsupported, errors = {}, {}, []
    t_all = time.perf_counter()
    for i, spec in enumerate(selected, 1):
        t0 = time.perf_counter()
        try:
            entry = run_case(spec, args.out)
        except Unsupported as e:
            prev = committed.get(spec.name)
            if str(e).startswith("host:") and prev is not None and \
                    os.path.exists(os.path.join(args.out, prev["file"])):
                # This CPU cannot run it; the fixture another CPU produced
                # is kept (its info.host, where recorded, says which).
                entries[spec.name] = prev
                print(f"[{i:3d}/{len(selected)}] {spec.name}: kept ({e})", flush=True)
                continue
            unsupported[spec.name] = {"case": spec.name, "engine": spec.engine,
                                      "reason": str(e)}
            print(f"[{i:3d}/{len(selected)}] {spec.name}: unsupported ({e})", flush=True)
            continue
        except Exception:  # noqa: BLE001 - report every broken case, then fail
            errors.append(spec.name)
            print(f"[{i:3d}/{len(selected)}] {spec.name}: ERROR\n{traceback.format_exc()}",
                  file=sys.stderr, flush=True)
            continue
        entries[spec.name] = entry
        print(f"[{i:3d}/{len(selected)}] {spec.name}  {entry['bytes'] / 1024:.1f} KiB  "
              f"{time.perf_counter() - t0:.2f}s", flush=True)
    elapsed = time.perf_counter() - t_all

    # Keep the catalogue's order; with --only, keep the other cases' entries.
    names = {c.name for c in cases}
    merged = {**{k: v for k, v in old.items() if k in names}, **entries}
    for name in entries:
        old_unsupported.pop(name, None)
    for name in unsupported:
        merged.pop(name, None)
    manifest = [merged[c.name] for c in cases if c.name in merged]
    _write_json(manifest_path, manifest)
    _write_json(unsupported_path,
                [v for c in cases for v in [{**old_unsupported, **unsupported}.get(c.name)]
                 if v is not None])
    if not args.only:   # a full run removes fixtures of cases that are gone
        keep = {e["file"] for e in manifest}
        for f in os.listdir(args.out):
            if f.endswith(".pb") and f not in keep:
                os.unlink(os.path.join(args.out, f))

    total = sum(e["bytes"] for e in manifest)
    print(f"\ngenerate.py: {len(entries)} fixtures written in {elapsed:.1f} s "
          f"({len(unsupported)} unsupported, {len(errors)} errors); manifest has "
          f"{len(manifest)} fixtures, {total / 1024 / 1024:.2f} MiB, largest "
          f"{max((e['bytes'] for e in manifest), default=0) / 1024:.1f} KiB")
    if errors:
        print("errors: " + ", ".join(errors), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
