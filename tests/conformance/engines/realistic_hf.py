"""Hugging Face transformers attention at realistic shapes
(engines/realistic.py).

A prefill of 1k-32k tokens through a whole model is out of reach on a
shared 2-core machine, so the decode step is run the way the model's own
attention layer runs it, piece by piece, with the library's code:

  RoPE       the model's rotary embedding module (`<Model>RotaryEmbedding`,
             cos/sin computed in fp32 and cast to the model dtype) and the
             modeling module's `apply_rotary_pos_emb` (each op in the model
             dtype), applied to every cached key at its position (what the
             prefill stored) and to this step's q and key
  attention  the function the layer calls (`eager_attention_forward` of the
             modeling module, or ALL_ATTENTION_FUNCTIONS["sdpa"]), called
             with the layer module itself and the keyword arguments its
             forward passes (scaling, sliding_window, softcap, s_aux)

The layer module is the real one (`<Model>Attention(config, layer_idx)`),
so its scaling, soft-cap, window and sinks come from the config as in the
model. What is left out is the projections and norms, which attention
does not see. Sliding-window layers read the last W keys (HF's sliding
cache keeps W - 1 and appends the new one). Each row is its own request.
K/V go into a shuffled page pool (engines/common.page_rows).
"""

from __future__ import annotations

import copy
import functools
import importlib
from dataclasses import replace
from typing import Any, Dict, Optional, Tuple

from . import realistic as R
from .common import Capture, Unsupported, page_rows, unique_positions

ENGINES = ("hf-eager", "hf-sdpa")
# arch -> (modeling module, class prefix, layer index of a window layer /
# of a global layer)
FAMILIES = {
    "llama3-8b": ("llama", "Llama", None, 0),
    "mha-7b": ("llama", "Llama", None, 0),
    "qwen2-7b": ("qwen2", "Qwen2", None, 0),
    "qwen3-8b": ("qwen3", "Qwen3", None, 0),
    "gemma2-9b": ("gemma2", "Gemma2", 0, 1),
    "gemma2-27b": ("gemma2", "Gemma2", 0, 1),
    "gemma3-27b": ("gemma3", "Gemma3", 0, 5),
    "gptoss-20b": ("gpt_oss", "GptOss", 0, 1),
    "phi3-mini": ("phi3", "Phi3", None, 0),
}
EAGER_ARCHS = tuple(FAMILIES)
# sdpa drops Gemma2's soft-cap (a real behaviour, kept as a bug case) and
# GPT-OSS refuses sdpa.
SDPA_ARCHS = ("llama3-8b", "mha-7b", "qwen2-7b", "qwen3-8b", "gemma3-27b", "phi3-mini")
ROPE_BUGS = ("rope-offset", "k-rope-twice", "rope-style", "rope-theta",
             "rope-scaling-ignored")
BUGS = (None, "softcap-missing", "wrong-scale", "sinks-missing", "sdpa-drops-softcap") + \
    ROPE_BUGS




def make_config(a: R.Arch, impl: str, theta: Optional[float] = None,
                scaling: Any = "model", partial: Optional[float] = None):
    """A transformers config of the architecture (hidden size small: the
    projections are not used)."""
    import transformers as T
    fam = FAMILIES[a.name][0]
    theta = a.theta if theta is None else theta
    sc = a.scaling if scaling == "model" else scaling
    rp = {"rope_type": "default", "rope_theta": theta}
    if sc:
        rp = {**{k: v for k, v in sc.items()}, "rope_theta": theta}
    if partial is not None:
        rp["partial_rotary_factor"] = partial
    common = dict(vocab_size=64, hidden_size=64, intermediate_size=64,
                  num_attention_heads=a.H, num_key_value_heads=a.Hkv, head_dim=a.D,
                  max_position_embeddings=max(a.max_position, 131072))
    if fam == "llama":
        cfg = T.LlamaConfig(num_hidden_layers=1, rope_parameters=rp, **common)
    elif fam == "qwen2":
        cfg = T.Qwen2Config(num_hidden_layers=1, rope_parameters=rp, **common)
    elif fam == "qwen3":
        cfg = T.Qwen3Config(num_hidden_layers=1, rope_parameters=rp, **common)
    elif fam == "gemma2":
        cfg = T.Gemma2Config(num_hidden_layers=2, rope_parameters=rp,
                             query_pre_attn_scalar=int(a.qpas), attn_logit_softcapping=a.softcap,
                             final_logit_softcapping=None,
                             sliding_window=R.ARCHS[a.name].window, **common)
    elif fam == "gemma3":
        cfg = T.Gemma3TextConfig(num_hidden_layers=6, query_pre_attn_scalar=int(a.qpas),
                                 sliding_window=1024,
                                 rope_parameters={"full_attention": rp,
                                                  "sliding_attention": {
                                                      "rope_type": "default",
                                                      "rope_theta": 10000.0}},
                                 **common)
    elif fam == "gpt_oss":
        cfg = T.GptOssConfig(num_hidden_layers=2, rope_parameters=rp, num_local_experts=4,
                             num_experts_per_tok=2,
                             sliding_window=R.ARCHS[a.name].window, **common)
    elif fam == "phi3":
        common.pop("head_dim")
        common["hidden_size"] = a.H * a.D
        cfg = T.Phi3Config(num_hidden_layers=1, rope_parameters=rp,
                           original_max_position_embeddings=a.max_position,
                           pad_token_id=0, bos_token_id=1, eos_token_id=2, **common)
    else:
        raise ValueError(fam)
    cfg._attn_implementation = impl
    return cfg


@functools.lru_cache(maxsize=8)
def _layer(arch_name: str, H: int, Hkv: int, window_layer: bool, impl: str,
           dtype_name: str):
    """(modeling module, config, attention layer, rotary embedding)."""
    import torch
    a = replace(R.ARCHS[arch_name], H=H, Hkv=Hkv)
    fam, prefix, win_idx, glob_idx = FAMILIES[arch_name]
    mod = importlib.import_module(f"transformers.models.{fam}.modeling_{fam}")
    cfg = make_config(a, impl)
    idx = win_idx if window_layer and win_idx is not None else glob_idx
    torch.manual_seed(0)
    layer = getattr(mod, f"{prefix}Attention")(cfg, idx).to(R_dtype(dtype_name)).eval()
    rotary = rotary_of(mod, prefix, cfg)
    return mod, cfg, layer, rotary


def R_dtype(name: str):
    import torch
    return {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[name]


def rotary_of(mod, prefix: str, cfg):
    return getattr(mod, f"{prefix}RotaryEmbedding")(config=cfg)


def cos_sin(rotary, cfg, positions, dtype, layer):
    """The rotary module's cos/sin for positions [T] ([1, T, rotary_dim])."""
    import torch
    x = torch.zeros(1, dtype=dtype)
    kw = {}
    if hasattr(rotary, "layer_types"):          # Gemma3: per layer type
        kw["layer_type"] = cfg.layer_types[layer.layer_idx]
    return rotary(x, positions[None], **kw)


def inv_freq_of(rotary, cfg, layer):
    if hasattr(rotary, "layer_types"):
        return getattr(rotary, f"{cfg.layer_types[layer.layer_idx]}_inv_freq")
    return rotary.inv_freq


def _rotate_gptj(x, cos, sin):
    """GPT-J pairing, each op in x's dtype (rope-style bug)."""
    import torch
    half = x.shape[-1] // 2
    c = cos[..., :half].repeat_interleave(2, dim=-1)
    s = sin[..., :half].repeat_interleave(2, dim=-1)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    rot = torch.stack((-x2, x1), dim=-1).flatten(-2)
    return (x * c) + (rot * s)


def _pass(spec: R.RSpec, d: R.Draw, data: R.Data, bug: Optional[str], impl: str):
    """One engine pass: per row, RoPE and the layer's attention call."""
    import torch
    a = d.arch
    dtype = R_dtype(spec.dtype)
    mod, cfg, layer, rotary = _layer(R.ARCHS[a.name].name, a.H, a.Hkv, bool(a.window), impl,
                                     spec.dtype)
    engine_rotary = rotary
    if bug in ("rope-theta", "rope-scaling-ignored"):
        theta = None
        if bug == "rope-theta":
            theta = 10000.0 if a.theta != 10000.0 else 500000.0
        wrong = make_config(a, impl, theta=theta,
                            scaling=None if bug == "rope-scaling-ignored" else "model")
        wrong.layer_types = getattr(cfg, "layer_types", None)
        engine_rotary = rotary_of(mod, FAMILIES[a.name][1], wrong)
    apply = mod.apply_rotary_pos_emb
    if bug == "rope-style":
        def apply(q, k, cos, sin, *args, **kw):   # noqa: E306
            c, s = cos.unsqueeze(1), sin.unsqueeze(1)
            return _rotate_gptj(q, c, s), _rotate_gptj(k, c, s)
    layer_call = layer
    if bug == "sinks-missing":
        if getattr(layer, "sinks", None) is None:
            raise Unsupported("no sinks")
        layer_call = copy.deepcopy(layer)
        with torch.no_grad():
            layer_call.sinks.fill_(float("-inf"))
    scaling = layer.scaling
    softcap = getattr(layer, "attn_logit_softcapping", None)
    if bug == "wrong-scale":
        scaling = a.D ** -0.5
        if abs(scaling - layer.scaling) < 1e-12:
            raise Unsupported("scale is already 1/sqrt(D)")
    if bug == "softcap-missing":
        if not softcap:
            raise Unsupported("no soft-cap")
        softcap = None
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    fn = ALL_ATTENTION_FUNCTIONS.get_interface(impl, mod.eager_attention_forward)
    kwargs = {"dropout": 0.0, "scaling": scaling}
    if hasattr(layer, "sliding_window"):
        kwargs["sliding_window"] = layer.sliding_window
    if softcap is not None or hasattr(layer, "attn_logit_softcapping"):
        kwargs["softcap"] = softcap
    if getattr(layer, "sinks", None) is not None:
        kwargs["s_aux"] = layer_call.sinks
    outs, qs, ks = [], [], []
    window = a.window
    for b, L in enumerate(d.lens):
        pos = d.positions[b, :L]
        cos, sin = cos_sin(engine_rotary, cfg, pos, dtype, layer)
        kpre = data.k[b].transpose(0, 1)[None]                  # [1, Hkv, L, D]
        qpre = data.q[b][None, :, None]                         # [1, H, 1, D]
        _, kpost = apply(kpre, kpre, cos, sin)
        cq, sq = cos[:, -1:], sin[:, -1:]
        if bug == "rope-offset":
            cq, sq = cos_sin(engine_rotary, cfg, pos[-1:] + 1, dtype, layer)
        qpost, _ = apply(qpre, kpre[:, :, -1:], cq, sq)
        if bug == "k-rope-twice":
            _, kpost = apply(kpost, kpost, cos, sin)
        lo = max(0, L - window) if window else 0
        kk = kpost[:, :, lo:]
        vv = data.v[b].transpose(0, 1)[None, :, lo:]
        with torch.no_grad():
            out, _ = fn(layer_call, qpost, kk, vv, None, **kwargs)
        outs.append(out[0, 0])                                 # [H, D]
        qs.append(qpost[0, :, 0])
        ks.append(kpost[0].transpose(0, 1))                    # [L, Hkv, D]
    return {"out": torch.stack(outs), "q_post": torch.stack(qs), "keys": ks,
            "rotary": engine_rotary, "cfg": cfg, "layer": layer}


def capture(spec: R.RSpec) -> Capture:
    import torch
    torch.set_num_threads(1)
    if spec.engine not in ENGINES:
        raise ValueError(spec.engine)
    impl = "eager" if spec.engine == "hf-eager" else "sdpa"
    if spec.bug not in BUGS:
        raise ValueError(f"realistic hf: no injection for {spec.bug!r}")
    if spec.dtype.startswith("fp8"):
        raise Unsupported("transformers' cache has no fp8 KV")
    archs = EAGER_ARCHS if impl == "eager" else SDPA_ARCHS
    if spec.arch and spec.arch not in archs and spec.kind == "clean":
        raise Unsupported(f"{spec.arch} with {impl}")
    if spec.arch == "gptoss-20b" and impl == "sdpa":
        raise Unsupported("GptOss has no sdpa attention (_supports_sdpa = False)")
    d = R.draw(spec, archs, page_choices=(16, 32, 128),
               table_choices=(None, "inv_freq", "rows"), small_heads=R.small_heads)
    a = d.arch
    dtype = R_dtype(spec.dtype)
    mod, cfg, layer, rotary = _layer(R.ARCHS[a.name].name, a.H, a.Hkv, bool(a.window), impl,
                                     spec.dtype)
    bug = spec.bug if spec.kind != "clean" else None
    # The data and the clean pass are shared with the other cases of the
    # seed that have the same memo key (their clean twins included).
    memo = R.memo_get(spec, d)
    if memo is not None:
        data, clean = memo
    else:
        inv64 = inv_freq_of(rotary, cfg, layer).double()
        data = R.make_data(spec, d, dtype, inv64)
    if a.sinks:
        # The layer's sinks are the data's (bf16-exact).
        with torch.no_grad():
            layer.sinks.copy_(data.sinks.to(layer.sinks.dtype))
    if memo is None:
        clean = _pass(spec, d, data, None, impl)
        R.memo_put(spec, d, (data, clean))
    run = _pass(spec, d, data, bug, impl) if bug else clean
    info: Dict[str, Any] = {"draw": d.describe(), "design": data.design, "impl": impl,
                            "host": R.host(), "layer": layer.layer_idx,
                            "scaling": float(layer.scaling)}
    if bug:
        # sdpa dropping the soft-cap is the engine's own behaviour: its
        # effect is measured against eager attention, which applies it.
        if bug == "sdpa-drops-softcap":
            clean = _pass(spec, d, data, None, "eager")
        info["bug_effect"] = float((run["out"].double() - clean["out"].double()).abs().max())
    args = snapshot_args(spec, d, data, run, layer, cfg)
    info["declaration"] = R.declare(args, spec, {"score_rounding": "nearest_even",
                                                 "probability_rounding": "nearest_even",
                                                 "output_rounding": "nearest_even",
                                                 "rope_rounding": "nearest_even"})
    return Capture(args=args, location=None, info=info)


def snapshot_args(spec: R.RSpec, d: R.Draw, data: R.Data, run, layer, cfg) -> Dict[str, Any]:
    import torch
    mode = spec.mode
    a = d.arch
    pre_k = mode == "pre-qk"
    pool_key = ("pool", pre_k)          # shared by the families of a seed (memo)
    if pool_key not in run:
        run[pool_key] = page_rows([data.k[b] if pre_k else run["keys"][b] for b in range(d.B)],
                                  list(data.v), d.page, "hnd", R._rng(spec, "pool"),
                                  extra_pages=R.extra_pages(spec))
    paged = run[pool_key]
    args: Dict[str, Any] = dict(
        q=data.q if mode in ("pre-q", "pre-qk") else run["q_post"],
        k_cache=paged.k_pool, v_cache=paged.v_pool, layout="hnd",
        block_table=paged.block_table, seq_lens=paged.seq_lens,
        key_positions=d.positions, query_positions=d.qpos,
        engine=spec.engine, engine_out=run["out"],
        softmax_scale=float(layer.scaling),
        rope=a.rope_config() | {"q_state": "pre" if mode in ("pre-q", "pre-qk") else "post",
                                "k_state": "pre" if pre_k else "post"},
        labels={"model": a.name, "engine": spec.engine,
                "backend": f"transformers/{spec.engine[3:]}", "layer": layer.layer_idx,
                "step": spec.seed})
    if getattr(layer, "attn_logit_softcapping", None):
        args["logit_softcap"] = float(layer.attn_logit_softcapping)
    if a.window:
        args.update(sliding_window=a.window, window_convention="hf")
    if a.sinks:
        args["sinks"] = layer.sinks.detach().to(torch.float32)
    if mode == "post+rolling":
        args["pre_rope_q"] = data.q
        args["pre_rope_k"] = torch.stack([data.k[b][L - 1] for b, L in enumerate(d.lens)])
    if d.table:
        rot = run["rotary"]
        if d.table == "inv_freq":
            args["rope_table"] = {"inv_freq": inv_freq_of(rot, cfg, layer).to(torch.float32)}
        else:
            pos = unique_positions(d.qpos, *[d.positions[b, :L] for b, L in enumerate(d.lens)])
            cos, sin = cos_sin(rot, cfg, pos, R_dtype(spec.dtype), layer)
            half = a.rdim // 2
            args["rope_table"] = {"positions": pos, "cos": cos[0, :, :half].contiguous(),
                                  "sin": sin[0, :, :half].contiguous()}
    return args
