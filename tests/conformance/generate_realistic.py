"""Generates the committed realistic subset (realistic_cases.committed_cases).

Each case runs its real engine at the "s" size (each architecture's head
dim and query-head group over one KV head, two heads for MHA; batch 4;
256-640 keys per row; pages 16-128; vLLM split-KV with 1-8 threads) with
the realistic statistics of engines/realistic.py, and is written
xz-compressed to `<out>/<case>.pb.xz` (bf16 snapshots compress by about a
quarter), with `<out>/manifest.json` in replay.py's format:

  {"case", "engine", "model", "mode", "dtype", "kind", "bug", "variant",
   "decl", "file", "bytes", "expect": {"verdict", "hypothesis", "location"},
   "known_failure": "..." (optional), "info": {draw, design, host, ...}}

`info.host` records the CPU that produced the fixture and the flags that
decide vLLM's paths (AVX-512, AVX512_BF16, AMX): vLLM's real bf16 path
truncates on CPUs without AVX512_BF16, so its fixtures hold the host's
narrowing (the emulations hold theirs on any CPU). Regenerating on another
CPU changes the real-vLLM fixtures, never the expectations, which are the
truth of what ran. `known_failure` marks are kept from the previous
manifest (they name the issue that will fix the auditor; replay.py fails
when a marked fixture starts meeting its expectation, so the mark is
removed with the fix).

usage (in the conformance venv):
  build/conformance-venv/bin/python tests/conformance/generate_realistic.py \\
      [--out tests/conformance/fixtures/realistic] [--only PATTERN]
"""

from __future__ import annotations

import argparse
import json
import lzma
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from realistic_cases import committed_cases  # noqa: E402
from sweep import driver, expect_of  # noqa: E402


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, float):
        return round(x, 6)
    if isinstance(x, (str, int, bool)) or x is None:
        return x
    return str(x)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(HERE, "fixtures", "realistic"))
    ap.add_argument("--only")
    args = ap.parse_args(argv)
    import torch
    torch.set_num_threads(1)
    os.makedirs(args.out, exist_ok=True)
    mpath = os.path.join(args.out, "manifest.json")
    old = {}
    if os.path.exists(mpath):
        with open(mpath) as f:
            old = {e["case"]: e for e in json.load(f)}
    entries = dict(old) if args.only else {}
    for spec in committed_cases():
        if args.only and args.only not in spec.name:
            continue
        t0 = time.perf_counter()
        cap = driver(spec.engine).capture(spec)
        raw = os.path.join(args.out, spec.name + ".pb")
        cap.snapshot().save(raw)
        with open(raw, "rb") as f:
            data = f.read()
        os.unlink(raw)
        path = raw + ".xz"
        with open(path, "wb") as f:
            f.write(lzma.compress(data, preset=9 | lzma.PRESET_EXTREME))
        entry = {"case": spec.name, "engine": spec.engine, "model": cap.info["draw"]["arch"],
                 "mode": spec.mode, "dtype": spec.dtype, "kind": spec.kind, "bug": spec.bug,
                 "variant": spec.variant, "decl": spec.decl, "file": os.path.basename(path),
                 "bytes": os.path.getsize(path), "raw_bytes": len(data),
                 "expect": expect_of(spec, cap.location),
                 "info": _jsonable({k: v for k, v in cap.info.items()})}
        if spec.name in old and old[spec.name].get("known_failure"):
            entry["known_failure"] = old[spec.name]["known_failure"]
        entries[spec.name] = entry
        print(f"{spec.name}: {entry['bytes'] / 1024:.0f} KiB ({len(data) / 1024:.0f} KiB raw) "
              f"{time.perf_counter() - t0:.1f} s", flush=True)
    order = [s.name for s in committed_cases()]
    manifest = [entries[n] for n in order if n in entries]
    with open(mpath, "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    keep = {e["file"] for e in manifest}
    for f in os.listdir(args.out):
        if f.endswith(".xz") and f not in keep:
            os.unlink(os.path.join(args.out, f))
    total = sum(e["bytes"] for e in manifest)
    print(f"generate_realistic.py: {len(manifest)} fixtures, {total / 2**20:.2f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
