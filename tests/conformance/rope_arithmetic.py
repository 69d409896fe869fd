"""Checks, bit for bit, how real engines round while they apply RoPE.

attnaudit's RoPE cast points (proto RopeCastPoint) claim:
  vLLM (rotary_embedding op)  "cos_sin":  cos/sin rounded to the model dtype,
                              the rotation in fp32, one cast at the end;
  Hugging Face                "each_op":  cos/sin rounded to the model dtype,
                              x*cos and rotate_half(x)*sin each rounded to it,
                              then their sum rounded;
  torch-flash-cpu (this suite's own fp32 RoPE)  "after_rope".

This script runs the engines' own RoPE on random inputs at positions up to
131k and compares their bits with emulations of those profiles (and of the
fused multiply-add forms a vectorised kernel may use). It prints one line
per (engine, dtype, style, rotary dim) with the share of elements that
differ from each emulation.

usage: python rope_arithmetic.py [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _emulations(x, cos, sin, neox: bool, rd: int, dtype):
    """Candidate arithmetics: x [T, H, D] in the model dtype, cos/sin
    [T, rd/2] as the engine holds them (already in the model dtype when it
    rounds them). Returns {name: result in the model dtype}."""
    import torch
    xf = x.to(torch.float64)
    c = cos.to(torch.float64)[:, None, :]
    s = sin.to(torch.float64)[:, None, :]
    if neox:
        x1, x2 = xf[..., : rd // 2], xf[..., rd // 2: rd]
    else:
        x1, x2 = xf[..., 0:rd:2], xf[..., 1:rd:2]
    f32 = lambda t: t.to(torch.float32).to(torch.float64)          # noqa: E731
    rnd = lambda t: t.to(dtype).to(torch.float64)                  # noqa: E731
    forms = {
        # fp32 products and sum, one cast
        "fp32, one cast": (f32(f32(x1 * c) - f32(x2 * s)), f32(f32(x2 * c) + f32(x1 * s))),
        # fp32 with the second product fused: fma(-x2, s, x1*c)
        "fp32 fma, one cast": (f32(f32(x1 * c) - x2 * s), f32(f32(x2 * c) + x1 * s)),
        # each op rounded to the model dtype
        "each op": (rnd(rnd(x1 * c) - rnd(x2 * s)), rnd(rnd(x2 * c) + rnd(x1 * s))),
    }
    out = {}
    for name, (a, b) in forms.items():
        r = xf.clone()
        if neox:
            r[..., : rd // 2], r[..., rd // 2: rd] = a, b
        else:
            r[..., 0:rd:2], r[..., 1:rd:2] = a, b
        out[name] = r.to(dtype)
    return out


def _compare(engine_out, emulations):
    import torch
    n = engine_out.numel()
    return {name: round(float((~torch.eq(engine_out.to(torch.float64),
                                         e.to(torch.float64))).sum()) / n, 6)
            for name, e in emulations.items()}


def vllm_rows():
    import torch
    from engines import vllm_cpu
    from dataclasses import replace
    rows = []
    g = torch.Generator().manual_seed(7)
    base = vllm_cpu.MODELS["llama"]
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for neox in (True, False):
            for rd in (64, 32):
                m = replace(base, neox=neox, rotary_dim=0 if rd == 64 else rd)
                rope = vllm_cpu.get_rope(m, dtype)
                T, H = 256, 4
                pos = torch.randint(0, m.max_position, (T,), generator=g)
                x = torch.randn(T, H, m.D, generator=g).to(dtype)
                got = vllm_cpu.rotate(rope, pos, x, H)
                # The cache as the op reads it: already cast to the model dtype.
                cos, sin = rope.cos_sin_cache.to(dtype).index_select(0, pos).chunk(2, -1)
                emu = _emulations(x, cos, sin, neox, rd, dtype)
                # "cos_sin" = cos/sin in the model dtype, then fp32 rotation.
                rows.append({"engine": "vllm-cpu", "dtype": str(dtype)[6:],
                             "style": "neox" if neox else "gptj", "rotary_dim": rd,
                             "differs_from": _compare(got, emu)})
    return rows


def hf_rows():
    import importlib
    import torch
    rows = []
    g = torch.Generator().manual_seed(8)
    for module, width in (("transformers.models.llama.modeling_llama", "full"),
                          ("transformers.models.gpt_oss.modeling_gpt_oss", "half")):
        mod = importlib.import_module(module)
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            T, H, D = 256, 4, 64
            pos = torch.randint(0, 131072, (T,), generator=g).to(torch.float32)
            inv = 1.0 / (500000.0 ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
            ang = pos[:, None] * inv[None, :]
            cos, sin = ang.cos().to(dtype), ang.sin().to(dtype)      # HF casts cos/sin
            x = torch.randn(1, H, T, D, generator=g).to(dtype)
            c, s = (cos, sin) if width == "half" else (torch.cat([cos, cos], -1),
                                                        torch.cat([sin, sin], -1))
            got, _ = mod.apply_rotary_pos_emb(x, x, c[None], s[None])
            emu = _emulations(x[0].transpose(0, 1), cos, sin, True, D, dtype)
            rows.append({"engine": f"hf ({module.rsplit('.', 1)[1]})",
                         "dtype": str(dtype)[6:], "style": "neox", "rotary_dim": D,
                         "differs_from": _compare(got[0].transpose(0, 1), emu)})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args(argv)
    import torch
    torch.set_num_threads(1)
    rows = vllm_rows() + hf_rows()
    for r in rows:
        diffs = ", ".join(f"{k}: {v:.4f}" for k, v in r["differs_from"].items())
        print(f"{r['engine']:28s} {r['dtype']:9s} {r['style']:5s} rd={r['rotary_dim']:3d}  "
              f"share of elements differing from  {diffs}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
