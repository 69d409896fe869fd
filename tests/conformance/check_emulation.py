"""Checks that the software bf16 narrowing is vLLM's real bf16 path on
this host, bit for bit.

vLLM's CPU kernels narrow fp32 -> bf16 toward zero on CPUs without
AVX512_BF16 (its NeoX RoPE and its attention output; its GPT-J RoPE rounds
to nearest) and to nearest on CPUs with it. The realistic suite's
`vllm-cpu-emu-rtz` and `vllm-cpu-emu-rne` engines run the same kernels in
fp32 on the bf16 values and narrow in software (engines/realistic_vllm_cpu),
so the truncating path is tested on any CPU. This script runs the real bf16
engine and the emulation of this host's narrowing on the same data (four
architectures: NeoX and GPT-J RoPE, split-KV, sinks, soft-cap) and fails
unless the post-RoPE q, every cached key and every output element are
equal. The other emulation must differ (else the check cannot tell them
apart).

usage (in the conformance venv): python3 tests/conformance/check_emulation.py
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main() -> int:
    import torch
    torch.set_num_threads(1)
    from engines import realistic as R
    from engines import realistic_vllm_cpu as RV
    host = R.host()
    same = "vllm-cpu-emu-rtz" if host["bf16_narrowing"] == "toward_zero" else "vllm-cpu-emu-rne"
    other = "vllm-cpu-emu-rne" if same == "vllm-cpu-emu-rtz" else "vllm-cpu-emu-rtz"
    print(f"host: {host['cpu']} [{','.join(host['flags'])}]: expects {same}")
    bad = 0
    for arch, threads in (("llama3-8b", 4), ("gptoss-20b", 1), ("gemma2-27b", 8),
                          ("partial-gptj", 4)):
        spec = R.RSpec("vllm-cpu", "bf16", "post", seed=3, arch=arch, threads=threads, size="s")
        d = R.draw(spec, RV.ARCHS, small_heads=R.small_heads)
        m = RV.vmodel(d.arch, d)
        real = RV.Engine("vllm-cpu", "bf16", m)
        data = R.make_data(spec, d, torch.bfloat16, RV.inv_freq_of(real.rope(m)).double())
        a = RV._pass(spec, d, data, real, m, None)
        row = []
        for name in (same, other):
            e = RV.Engine(name, "bf16", m)
            b = RV._pass(spec.replace(engine=name), d, data, e, m, None)
            eq = {"q": float((a["q_post"] == b["q_post"]).float().mean()),
                  "k": float(torch.cat([(x == y).float().flatten()
                                        for x, y in zip(a["keys"], b["keys"])]).mean()),
                  "out": float((a["out"] == b["out"]).float().mean())}
            row.append(eq)
        ok = all(v == 1.0 for v in row[0].values()) and row[1]["out"] < 1.0
        bad += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {arch:13s} kv_splits {a['metadata']['kv_splits']:2d}: "
              f"{same} equal {row[0]}; {other} equal {row[1]}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
