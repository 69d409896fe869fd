"""Realistic shapes and statistics for the conformance suite's scale cases.

The toy cases (cases.py: B = 2, 1-2 KV heads, 16-61 keys, N(0, 1) data)
are too small for the error model's long-context and many-cell terms and
too flat for its score terms. A realistic case (`RSpec`) draws, from its
seed, the shape users run and attention as trained models make it:

shape       an architecture of ARCHS (head dim 64-256, 28-64 query heads
            over 4-16 KV heads, and MHA), batch 4-8, 1k-8k keys per row
            ("m"), 16k-32k ("l") or 256-1.1k with fewer heads ("s", the
            committed subset), pages of 16, 32 or 128, the engine's thread
            count (vLLM's CPU scheduler splits a row's keys over threads:
            split-KV whenever it runs with more than one)
statistics  a sink token at position 0 whose key has a large norm and takes
            30-90 % of the weight of most heads; a few outlier channels in
            q and k (a constant offset along low-frequency RoPE pairs, as
            in trained models' "massive activations"); peaked cells whose
            largest logit (besides the sink) is 15-50; logits of the rest
            with a standard deviation of 1-2.5
positions   every row from 0 (the sink) to L - 1, or ("long") the sink at 0
            and the rest at 60k-100k, as a cache that kept its sink and
            recent tokens has them

The design is made in fp64 in post-RoPE space (so the sink and peak
logits are what they are meant to be whatever the positions) and rotated
back to pre-RoPE space with the model's inverse frequencies; each engine
then rotates the pre-RoPE values with its own RoPE, as it would. Nothing
here depends on attnaudit: the data are the truth's input, the engine's
output is the engine's.
"""

from __future__ import annotations

import math
import os
import zlib
from dataclasses import dataclass, field, replace
from typing import Any, Dict, Optional, Tuple

# ----------------------------------------------------------------------
# Architectures (head layout, RoPE, scale, soft-cap, window, sinks)
# ----------------------------------------------------------------------

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
GPT_OSS_YARN = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
                "beta_slow": 1.0, "original_max_position_embeddings": 4096,
                "truncate": False}


@dataclass(frozen=True)
class Arch:
    """One attention layer's configuration, as a released model has it."""

    name: str
    H: int
    Hkv: int
    D: int
    theta: float
    scaling: Optional[Dict[str, Any]] = None
    neox: bool = True
    rotary_dim: int = 0            # 0: D
    qpas: Optional[float] = None   # query_pre_attn_scalar: scale = qpas ** -0.5
    softcap: float = 0.0
    window: int = 0                # HF convention: W keys (0: none)
    sinks: bool = False
    max_position: int = 131072

    @property
    def scale(self) -> float:
        return float(self.qpas or self.D) ** -0.5

    @property
    def rdim(self) -> int:
        return self.rotary_dim or self.D

    def rope_config(self) -> Dict[str, Any]:
        """The true RoPE config in attnaudit terms."""
        out = {"theta": self.theta, "style": "neox" if self.neox else "gptj",
               "rotary_dim": self.rdim}
        if self.scaling:
            out["scaling"] = dict(self.scaling)
        return out


ARCHS: Dict[str, Arch] = {a.name: a for a in (
    # Llama-3.1-8B: 32/8 heads of 128, theta 500000, llama3 scaling.
    Arch("llama3-8b", 32, 8, 128, 500000.0, scaling=LLAMA3),
    # Qwen2.5-7B: 28/4 heads of 128, theta 1e6.
    Arch("qwen2-7b", 28, 4, 128, 1000000.0, max_position=32768),
    # Qwen3-8B: 32/8 heads of 128, theta 1e6.
    Arch("qwen3-8b", 32, 8, 128, 1000000.0, max_position=40960),
    # Llama-2-7B-like MHA: 32/32 heads of 128, theta 10000.
    Arch("mha-7b", 32, 32, 128, 10000.0, max_position=32768),
    # Gemma-2-9B: 16/8 heads of 256, query_pre_attn_scalar 256, soft-cap
    # 50, a 4096-key window on alternate layers.
    Arch("gemma2-9b", 16, 8, 256, 10000.0, qpas=256.0, softcap=50.0, window=4096,
         max_position=8192),
    # Gemma-2-27B: 32/16 heads of 128, query_pre_attn_scalar 144.
    Arch("gemma2-27b", 32, 16, 128, 10000.0, qpas=144.0, softcap=50.0, max_position=8192),
    # Gemma-3 with 32/16 heads of 128 and query_pre_attn_scalar 144 (a
    # global layer: theta 1e6, no soft-cap).
    Arch("gemma3-27b", 32, 16, 128, 1000000.0, qpas=144.0, max_position=131072),
    # GPT-OSS-20B: 64/8 heads of 64, sinks, YaRN, a 128-key window on
    # alternate layers.
    Arch("gptoss-20b", 64, 8, 64, 150000.0, scaling=GPT_OSS_YARN, sinks=True, window=128),
    # Phi-3-mini: MHA, 32/32 heads of 96 (HF only: vLLM's CPU kernels take
    # head dims that are multiples of 32 for every ISA path used here).
    Arch("phi3-mini", 32, 32, 96, 10000.0, max_position=4096),
    # Partial rotary, GPT-J pairing: GPT-J-6B's heads (16 of 256, MHA, 64
    # rotary dims), with a longer position range than GPT-J's 2048.
    Arch("partial-gptj", 16, 16, 256, 10000.0, neox=False, rotary_dim=64,
         max_position=32768),
)}


def with_window(a: Arch, on: bool) -> Arch:
    """The architecture's sliding-window layer (on) or its global layer."""
    return a if on else replace(a, window=0)


# ----------------------------------------------------------------------
# The realistic spec and its draw
# ----------------------------------------------------------------------

DECLS = ("preset", "measured", "undeclared")
SIZES = {
    # size: (batch choices, key range per row, heads override or None);
    # "s" is the committed subset: each architecture's head dim and group
    # over one KV head (two heads for MHA)
    "s": ((4,), (256, 512), "small"),
    "m": ((4, 4, 6, 8), (1024, 4096), None),
    "l": ((4,), (8192, 32768), None),
}


@dataclass(frozen=True)
class RSpec:
    """One realistic case: a family (engine x mode x dtype x declaration)
    at one seed, clean or with a bug. Unset fields are drawn from the
    seed (`draw`)."""

    engine: str                   # vllm-cpu, vllm-cpu-emu-rtz, vllm-cpu-emu-rne,
    #                               hf-eager, hf-sdpa, torch-flash-cpu
    dtype: str                    # bf16, f16, f32 (fp8_e4m3 on vLLM where the ISA has it)
    mode: str = "post"            # post, post+rolling, pre-q, pre-qk
    decl: str = "preset"          # preset (engine=), measured (engine= + the
    #                               measured rounding), undeclared (neither)
    kind: str = "clean"           # clean | bug | capture-bug
    bug: Optional[str] = None
    variant: Optional[str] = None
    hypothesis: Optional[str] = None   # expected top diagnosis (default: bug)
    arch: Optional[str] = None    # None: drawn from the engine's list
    window_layer: Optional[bool] = None  # None: drawn where the arch has a window
    size: str = "m"
    positions: str = "start"      # start (0..L-1) | long (sink at 0, rest at 60k-100k)
    table: Optional[str] = None   # None: drawn (none / the engine's) for non-post modes
    threads: Optional[int] = None  # vLLM: OMP threads of the kernel (None: drawn)
    page: Optional[int] = None
    seed: int = 0
    tag: str = ""                 # a free label that makes the name unique

    @property
    def family(self) -> str:
        return ".".join([self.engine, self.mode.replace("+", "-"), self.dtype, self.decl])

    @property
    def name(self) -> str:
        parts = [self.engine, self.arch or "any", self.dtype, self.mode.replace("+", "-"),
                 self.decl, self.size]
        if self.positions != "start":
            parts.append(self.positions)
        if self.table is not None:
            parts.append(f"table-{self.table.replace('_', '')}")
        if self.window_layer is not None:
            parts.append("swa" if self.window_layer else "global")
        if self.bug:
            parts.append(self.bug + (f"{self.variant}" if self.variant and self.variant[0] in "+-"
                                     else f"-{self.variant}" if self.variant else ""))
        if self.tag:
            parts.append(self.tag)
        return ".".join(parts)

    @property
    def expected_hypothesis(self) -> Optional[str]:
        if self.kind == "clean":
            return None
        return self.hypothesis if self.hypothesis is not None else self.bug

    def replace(self, **kw) -> "RSpec":
        return replace(self, **kw)


@dataclass
class Draw:
    """What a seed chose."""

    arch: Arch
    B: int
    lens: Tuple[int, ...]
    page: int
    threads: int
    table: Optional[str]
    positions: Any                # int64 [B, T]; row b's key j at positions[b, j]
    qpos: Any                     # int64 [B]
    q_gain: float
    sink_w: Tuple[float, float]   # range of the target sink weight
    sink_heads: float             # share of heads with a sink
    outlier_pairs: int
    outlier_k: float
    outlier_q: float
    peak_frac: float
    peak_logit: Tuple[float, float]
    notes: Dict[str, Any] = field(default_factory=dict)

    def describe(self) -> Dict[str, Any]:
        return {"arch": self.arch.name, "B": self.B, "H": self.arch.H, "Hkv": self.arch.Hkv,
                "D": self.arch.D, "lens": list(self.lens), "page": self.page,
                "threads": self.threads, "table": self.table,
                "window": self.arch.window, "softcap": self.arch.softcap,
                "sinks": self.arch.sinks, "scale": self.arch.scale,
                "max_position": int(self.positions.max()),
                "q_gain": round(self.q_gain, 3), "outlier_pairs": self.outlier_pairs,
                "peak_frac": round(self.peak_frac, 3), **self.notes}


def _rng(spec: RSpec, salt: str):
    """A torch.Generator from the family-independent part of the spec (a
    bug case sees its clean twin's data: engine, dtype, arch, size,
    positions and seed; not mode, declaration or bug)."""
    import torch
    g = torch.Generator()
    key = f"{spec.engine}/{spec.dtype}/{spec.arch}/{spec.size}/{spec.positions}/" \
          f"{spec.window_layer}/{spec.seed}/{salt}"
    g.manual_seed(zlib.crc32(key.encode()) & 0x7FFFFFFF)
    return g


def _uniform(g, lo: float, hi: float) -> float:
    import torch
    return lo + (hi - lo) * float(torch.rand((), generator=g, dtype=torch.float64))


def _choice(g, items):
    import torch
    return items[int(torch.randint(len(items), (), generator=g))]


def draw(spec: RSpec, arch_choices, page_choices=(16, 32, 128),
         thread_choices=(1,), table_choices=(None,), small_heads=None) -> Draw:
    """The shape and statistics of a spec's seed."""
    import torch
    g = _rng(spec, "draw")
    if spec.positions == "long":     # positions up to 100k: models that reach them
        arch_choices = [n for n in arch_choices if ARCHS[n].max_position >= 100000]
    if spec.bug == "gqa-mapping":    # a GQA bug needs grouped heads
        arch_choices = [n for n in arch_choices if ARCHS[n].H != ARCHS[n].Hkv]
    arch = ARCHS[spec.arch] if spec.arch else ARCHS[_choice(g, tuple(arch_choices))]
    window_on = spec.window_layer
    if arch.window and window_on is None:
        window_on = bool(torch.rand((), generator=g) < 0.5)
    arch = with_window(arch, bool(window_on)) if arch.window else arch
    batches, (lo, hi), heads = SIZES[spec.size]
    if heads == "small" and small_heads:
        arch = small_heads(arch)
    B = int(_choice(g, batches))
    # Never past the model's positions (vLLM's cos/sin cache has
    # max_position rows; Gemma-2 has 8192).
    lens = tuple(min(int(round(math.exp(_uniform(g, math.log(lo), math.log(hi))))),
                     arch.max_position)
                 for _ in range(B))
    page = spec.page or int(_choice(g, tuple(page_choices)))
    threads = spec.threads or int(_choice(g, tuple(thread_choices)))
    if spec.mode == "post":
        table = None
    elif spec.table is not None:
        table = None if spec.table == "none" else spec.table
    else:
        table = _choice(g, tuple(table_choices))
    T = max(lens)
    if spec.positions == "long":
        starts = [int(_uniform(g, 60000, 100000 - L)) for L in lens]
        positions = torch.stack([torch.cat([torch.zeros(1, dtype=torch.int64),
                                            s + torch.arange(T - 1, dtype=torch.int64)])
                                 for s in starts])
    else:
        positions = torch.arange(T, dtype=torch.int64).repeat(B, 1)
    qpos = torch.tensor([int(positions[b, L - 1]) for b, L in enumerate(lens)])
    return Draw(arch=arch, B=B, lens=lens, page=page, threads=threads, table=table,
                positions=positions, qpos=qpos,
                q_gain=_uniform(g, 1.0, 2.5), sink_w=(0.3, 0.9),
                sink_heads=_uniform(g, 0.6, 1.0),
                outlier_pairs=int(_choice(g, (0, 1, 2, 3))),
                outlier_k=_uniform(g, 4.0, 12.0), outlier_q=_uniform(g, 1.5, 4.0),
                peak_frac=_uniform(g, 0.1, 0.4), peak_logit=(15.0, 50.0))


# ----------------------------------------------------------------------
# RoPE in fp64 (design only; engines rotate with their own RoPE)
# ----------------------------------------------------------------------


def rotate64(x, positions, inv_freq, rotary_dim: int, neox: bool, sign: float = 1.0):
    """x [..., T, Hx, D] float64 rotated by sign * position * inv_freq
    (inv_freq float64 [rotary_dim / 2]); positions broadcast to [..., T]."""
    import torch
    ang = sign * positions.to(torch.float64)[..., None] * inv_freq  # [..., T, R/2]
    cos = ang.cos()[..., None, :].to(x.dtype)
    sin = ang.sin()[..., None, :].to(x.dtype)
    out = x.clone()
    half = rotary_dim // 2
    if neox:
        x1, x2 = x[..., :half], x[..., half:rotary_dim]
        out[..., :half] = x1 * cos - x2 * sin
        out[..., half:rotary_dim] = x2 * cos + x1 * sin
    else:
        x1, x2 = x[..., 0:rotary_dim:2], x[..., 1:rotary_dim:2]
        out[..., 0:rotary_dim:2] = x1 * cos - x2 * sin
        out[..., 1:rotary_dim:2] = x2 * cos + x1 * sin
    return out


def low_freq_channels(arch: Arch, pairs: int):
    """The channels of the `pairs` lowest-frequency rotary pairs (both
    members), where trained models keep their outliers."""
    half = arch.rdim // 2
    out = []
    for i in range(half - pairs, half):
        out += [i, i + half] if arch.neox else [2 * i, 2 * i + 1]
    return out


# ----------------------------------------------------------------------
# The data
# ----------------------------------------------------------------------


@dataclass
class Data:
    """Pre-RoPE q [B, H, D], per-row keys and values [L, Hkv, D] (model
    dtype), the design's fp64 post-RoPE q, and what the design aimed at."""

    q: Any
    k: list
    v: list
    sinks: Any = None             # f32 [H] (GPT-OSS-like: the sink logits)
    design: Dict[str, Any] = field(default_factory=dict)


def make_data(spec: RSpec, d: Draw, dtype, inv_freq64) -> Data:
    """The realistic batch (see the module docstring). inv_freq64: the
    model's inverse frequencies, float64 [rotary_dim / 2]."""
    import torch
    g = _rng(spec, "data")
    a = d.arch
    B, H, Hkv, D = d.B, a.H, a.Hkv, a.D
    group = H // Hkv
    scale = a.scale
    T = max(d.lens)
    f64 = torch.float64

    # Keys (pre-RoPE): N(0, 1) plus outlier channels, a constant offset of
    # each channel's own sign per KV head.
    out_ch = low_freq_channels(a, d.outlier_pairs)
    k_bias = torch.zeros(Hkv, D, dtype=f64)
    q_bias = torch.zeros(H, D, dtype=f64)
    if out_ch:
        sgn = torch.randint(0, 2, (Hkv, len(out_ch)), generator=g).to(f64) * 2 - 1
        k_bias[:, out_ch] = d.outlier_k * sgn
        q_bias[:, out_ch] = d.outlier_q * (torch.randint(0, 2, (H, len(out_ch)), generator=g)
                                           .to(f64) * 2 - 1)
    ks, vs = [], []
    # The sink's key: a large norm along a direction of its own per KV head,
    # in the low-frequency half of the rotary pairs (it is at position 0,
    # where every RoPE is the identity).
    sink_dir = torch.randn(Hkv, D, generator=g, dtype=f64)
    sink_dir[:, : a.rdim // 4] = 0
    if a.neox:
        sink_dir[:, a.rdim // 2: a.rdim // 2 + a.rdim // 4] = 0
    sink_dir /= sink_dir.norm(dim=-1, keepdim=True)
    sink_norm = torch.empty(Hkv, dtype=f64).uniform_(3.0, 6.0, generator=g) * math.sqrt(D)
    f32 = torch.float32           # the bulk (keys, values) in fp32: design only
    for L in d.lens:
        k = torch.randn(L, Hkv, D, generator=g, dtype=f32) + k_bias.to(f32)
        k[0] = (sink_dir * sink_norm[:, None]).to(f32)
        v = torch.randn(L, Hkv, D, generator=g, dtype=f32)
        v[0] *= 0.2                     # a sink's value: small (a no-op token)
        ks.append(k)
        vs.append(v)

    # Post-RoPE keys as the design sees them (fp64 rotation of the rounded
    # pre-RoPE keys: what the engine rotates, up to its rounding).
    k_round = [k.to(dtype).to(f32) for k in ks]
    k_post = [rotate64(k, d.positions[b, :L][:, None].squeeze(-1), inv_freq64, a.rdim, a.neox)
              for b, (k, L) in enumerate(zip(k_round, d.lens))]

    # q: noise at the row's logit spread, outliers, then the peak and sink
    # components (post-RoPE), solved per (row, head) cell.
    q_post = torch.randn(B, H, D, generator=g, dtype=f64) * d.q_gain
    q_post += q_bias[None]
    qp = rotate64(q_post[:, None], d.qpos[:, None], inv_freq64, a.rdim, a.neox)[:, 0]
    q_post = qp                          # outliers rotated with the query position
    peak_cells = torch.rand(B, H, generator=g) < d.peak_frac
    sink_cells = torch.rand(B, H, generator=g) < d.sink_heads
    targets = torch.empty(B, H, dtype=f64).uniform_(*d.sink_w, generator=g)
    peak_logits = torch.empty(B, H, dtype=f64).uniform_(*d.peak_logit, generator=g)
    sink_logit = torch.zeros(B, H, dtype=f64)
    achieved = torch.zeros(B, H, dtype=f64)
    for b, L in enumerate(d.lens):
        kp = k_post[b].to(f64)                                 # [L, Hkv, D]
        lo = max(1, L - a.window) if a.window else 1           # visible, non-sink keys
        for h in range(H):
            kv = h // group
            if peak_cells[b, h] and L - lo > 1:
                j = lo + int(torch.randint(L - lo, (), generator=g))
                kj = kp[j, kv]
                cur = scale * float(q_post[b, h] @ kj)
                q_post[b, h] += (peak_logits[b, h] - cur) / (scale * float(kj @ kj)) * kj
        if not bool(sink_cells[b].any()):
            continue
        # The sink component: c * sink direction, with c found by bisection
        # so that the sink's softmax weight is the target.
        visible = (a.window == 0) or (L <= a.window)
        if not visible:
            continue                      # the sink is outside this row's window
        u = kp[0]                         # [Hkv, D] (position 0: unrotated)
        kk = kp[lo:L].transpose(0, 1)     # [Hkv, L', D]
        for h in range(H):
            if not sink_cells[b, h]:
                continue
            kv = h // group
            uh = u[kv] / u[kv].norm()
            base = scale * (kk[kv] @ q_post[b, h])             # [L']
            du = scale * (kk[kv] @ uh)
            s0 = scale * float(q_post[b, h] @ u[kv])
            ds0 = scale * float(u[kv] @ uh)
            lo_c, hi_c = -50.0, 400.0

            def weight(c):
                s = base + c * du
                s_sink = s0 + c * ds0
                m = max(float(s.max()), s_sink)
                den = float(torch.exp(s - m).sum()) + math.exp(s_sink - m)
                return math.exp(s_sink - m) / den, s_sink
            for _ in range(45):
                mid = 0.5 * (lo_c + hi_c)
                if weight(mid)[0] < targets[b, h]:
                    lo_c = mid
                else:
                    hi_c = mid
            c = 0.5 * (lo_c + hi_c)
            w, s_sink = weight(c)
            q_post[b, h] += c * uh
            sink_logit[b, h] = s_sink
            achieved[b, h] = w
    # Back to pre-RoPE: rotate by -qpos.
    q_pre = rotate64(q_post[:, None], d.qpos[:, None], inv_freq64, a.rdim, a.neox,
                     sign=-1.0)[:, 0]
    sinks = None
    if a.sinks:
        sinks = (1.0 + 2.0 * torch.rand(H, generator=g)).to(torch.bfloat16).float()
    design = {"sink_weight_mean": float(achieved[sink_cells].mean()) if sink_cells.any() else 0.0,
              "sink_cells": int(sink_cells.sum()), "peak_cells": int(peak_cells.sum()),
              "max_design_logit": float(torch.maximum(sink_logit, torch.where(
                  peak_cells, peak_logits, torch.zeros_like(peak_logits))).max())}
    return Data(q=q_pre.to(dtype), k=[k.to(dtype) for k in ks], v=[v.to(dtype) for v in vs],
                sinks=sinks, design=design)


# ----------------------------------------------------------------------
# bf16 narrowing, the host
# ----------------------------------------------------------------------


def to_bf16(x, rounding: str):
    """fp32 -> bf16 rounded to nearest even ("nearest") or toward zero
    ("toward_zero", what vLLM's CPU kernels do without AVX512_BF16)."""
    import torch
    x = x.to(torch.float32).contiguous()
    if rounding == "nearest":
        return x.to(torch.bfloat16)
    bits = x.view(torch.int32) & ~0xFFFF
    return bits.view(torch.float32).to(torch.bfloat16)   # exact: low bits are 0


def host() -> Dict[str, Any]:
    """The CPU that produced a capture: model and the flags that decide
    vLLM's CPU paths (AVX-512, AVX512_BF16, AMX)."""
    model, flags = "?", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and model == "?":
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    keep = ("avx2", "fma", "f16c", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16",
            "amx_tile")
    return {"cpu": model, "flags": [f for f in keep if f in flags],
            "bf16_narrowing": "nearest" if "avx512_bf16" in flags else "toward_zero",
            "nproc": os.cpu_count()}


# ----------------------------------------------------------------------
# The declaration
# ----------------------------------------------------------------------

# The preset a user names for each engine (docs/PYTHON.md, engine=), and
# its precision profile.
PRESET = {"vllm-cpu": "vllm-cpu", "vllm-cpu-emu-rtz": "vllm-cpu",
          "vllm-cpu-emu-rne": "vllm-cpu", "hf-eager": "hf-eager", "hf-sdpa": "hf-sdpa",
          "torch-flash-cpu": "torch-flash-cpu"}
PROFILE = {"vllm-cpu": "vllm_cpu", "hf-eager": "hf_eager", "hf-sdpa": "torch_flash_cpu",
           "torch-flash-cpu": "torch_flash_cpu"}


def declare(args: Dict[str, Any], spec: RSpec, rounding: Dict[str, str],
            evidence: str = "") -> Dict[str, Any]:
    """Sets the snapshot's declaration: `preset` names the engine as
    docs/PYTHON.md asks (engine=); `measured` adds the engine's measured
    rounding (what an engine probe declares: precision with the preset's
    profile, each cast's rounding, source "measured"); `undeclared` sends
    neither engine nor precision. Returns the declaration, for the record."""
    preset = PRESET[spec.engine]
    args.pop("precision", None)
    if spec.decl == "undeclared":
        args.pop("engine", None)
        return {"engine": None, "precision": None}
    args["engine"] = preset
    if spec.decl == "preset" and spec.engine.startswith("vllm-cpu-emu-"):
        # The builders resolve vllm-cpu's bf16 rounding by this CPU's ISA
        # (attnaudit.probe.preset); an emulation stands for the CPU whose
        # path it emulates, so it declares that CPU's preset: toward zero
        # without AVX512_BF16 (emu-rtz), to nearest with it (emu-rne).
        mode = "toward_zero" if spec.engine.endswith("rtz") else "nearest_even"
        prec = {"profile": PROFILE[preset], "output_rounding": mode, "rope_rounding": mode,
                "source": "preset",
                "evidence": f"engine preset 'vllm-cpu' as on a CPU "
                            f"{'without' if mode == 'toward_zero' else 'with'} avx512_bf16"}
        args["precision"] = prec
        return {"engine": preset, "precision": prec}
    if spec.decl == "measured":
        prec = {"profile": PROFILE[preset], **rounding, "source": "measured",
                "evidence": (evidence or f"conformance suite: {spec.engine}")[:1000]}
        args["precision"] = prec
        return {"engine": preset, "precision": prec}
    return {"engine": preset, "precision": None}


def small_heads(a: Arch) -> Arch:
    """The committed subset's heads: the architecture's group over one KV
    head (MHA: two heads), its head dim."""
    group = a.H // a.Hkv
    if group == 1:
        return replace(a, H=2, Hkv=2)
    return replace(a, H=min(group, 8), Hkv=1)


def extra_pages(spec: RSpec) -> int:
    """Unused pages of stale content in the pool (fewer for the committed
    subset, whose size is what it costs)."""
    return 1 if spec.size == "s" else 3


# ----------------------------------------------------------------------
# The clean pass, shared by the families of one seed
# ----------------------------------------------------------------------

_MEMO: Dict[tuple, Any] = {}


def memo_key(spec: RSpec, d: "Draw") -> tuple:
    """What a clean engine pass depends on: the engine, dtype, seed and what
    the seed drew (not the mode, the declaration or the RoPE table sent:
    only the snapshot depends on those), so the cases of a seed that share
    a draw share one pass. The statistics are drawn after the table, which
    `post` does not draw: they differ by mode and are part of the key."""
    return (spec.engine, spec.dtype, spec.arch, spec.window_layer, spec.positions, spec.size,
            spec.seed, d.arch.name, d.arch.H, d.arch.Hkv, d.arch.window, d.B, d.lens,
            d.page, d.threads, d.q_gain, d.sink_heads, d.outlier_pairs, d.outlier_k,
            d.outlier_q, d.peak_frac, tuple(d.qpos.tolist()))


def memo_get(spec: RSpec, d: "Draw"):
    return _MEMO.get(memo_key(spec, d))


def memo_put(spec: RSpec, d: "Draw", value) -> None:
    _MEMO.clear()                     # one pass kept: the sweep orders by it
    _MEMO[memo_key(spec, d)] = value
