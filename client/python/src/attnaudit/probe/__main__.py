"""python -m attnaudit.probe --engine vllm-cpu|hf-eager|hf-sdpa|torch-flash-cpu
[--dtype bf16] [--head-dim 128] [--max-keys 32768] [--family llama] [--json]

Runs the engine probe on this host and prints the fit: the precision to
declare (Snapshot's precision= and the RoPE cast point), the line of
evidence it carries, and each finding's counts. --json prints
ProbeResult.to_dict(). Exit status 0 when every quantity the engine can
show was determined, 1 when one was not, 2 when the engine could not run.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import List, Optional

from . import ProbeResult, adapters, run


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m attnaudit.probe", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", required=True, choices=adapters.ENGINES)
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "f16", "f32"))
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--heads", default="8,2", help="query heads, KV heads (default 8,2)")
    ap.add_argument("--max-keys", type=int, default=32768,
                    help="the longest row of the long-row check (default 32768)")
    ap.add_argument("--rope", default="custom_op", choices=adapters.ROPE_PATHS,
                    help="vllm-cpu: which RoPE path (custom_op: enforce_eager engines; "
                         "compiled: a default engine's inductor graph)")
    ap.add_argument("--family", default="llama",
                    help="hf-eager / hf-sdpa: the transformers model family whose "
                         "apply_rotary_pos_emb and rotary embedding run (default llama)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0,
                    help="torch threads (default: torch's own choice)")
    ap.add_argument("--json", action="store_true", help="print the whole result as JSON")
    args = ap.parse_args(argv)
    H, Hkv = (int(x) for x in args.heads.split(","))
    extra = {"rope_path": args.rope} if args.engine == "vllm-cpu" else {}
    if args.engine in ("hf-eager", "hf-sdpa"):
        extra["family"] = args.family
    try:
        if args.threads:
            import torch
            torch.set_num_threads(args.threads)
        eng = adapters.engine(args.engine, args.dtype, head_dim=args.head_dim,
                              heads=(H, Hkv), max_keys=args.max_keys, **extra)
        result = run(eng, seed=args.seed)
    except ImportError as e:
        print(f"attnaudit.probe: {args.engine} needs {e.name or e}: not installed here",
              file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print(report(result))
    undetermined = [k for k, f in result.findings.items()
                    if not f.determined and "not measured" not in f.line]
    return 1 if undetermined else 0


def report(result: ProbeResult) -> str:
    """The human-readable fit."""
    lines = [f"engine {result.engine} {result.dtype}: probed in {result.seconds:.1f} s",
             f"host   {result.host.get('cpu')} ({result.host.get('isa')})"]
    declared = {k: v for k, v in result.precision.items() if k != "evidence"}
    lines.append("precision " + json.dumps(declared))
    lines.append(f"rope.cast_point {result.cast_point or '(not declared)'}")
    lines.append("measured  " + json.dumps(result.measured))
    lines.append("findings:")
    for f in result.findings.values():
        lines.append(f"  {f.name:<14} {str(f.value):<24} {f.line}")
    lines.append("evidence: " + result.evidence)
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
