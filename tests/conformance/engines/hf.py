"""Hugging Face transformers attention, captured from real model runs.

Tiny models with random weights (no download: `AutoModelForCausalLM.
from_config(cfg, dtype=...)`, which keeps `rotary_emb.inv_freq` in fp32 as
`from_pretrained` does) run a prefill of T - 1 tokens and one decode token
with the cache (past_key_values), eager or sdpa attention. Each row of the
snapshot is its own request (batch 1, no padding); the snapshot's rows are
independent, as they are in attention.

The capture wraps, without editing the library, the modeling module's
module-global `apply_rotary_pos_emb` (pre-RoPE q/k in, rotated out) and the
attention function (the module's `eager_attention_forward`, or the "sdpa"
entry of `ALL_ATTENTION_FUNCTIONS`): it sees q as attention got it, the
K/V cache as attention read it (for sliding-window layers only the last
W tokens, whose positions come from the cache, not from arange), the mask,
the scaling / soft-cap / window / sinks kwargs, and the output before
o_proj. K/V are scattered into a shuffled page pool (page 16).

Families (FAMILIES): Llama (llama3 scaling), Qwen2, Qwen3 (q/k norm),
Gemma2 (soft-cap, sliding window on alternate layers,
query_pre_attn_scalar), Phi-3 with partial_rotary_factor 0.5, Phi-3 with
LongRoPE (Phi-3.5's scaling: short / long factors, attention factor), GPT-OSS
(sinks, YaRN, sliding window; eager only: GptOss has no sdpa).

RoPE bugs are injected by patching the model's RoPE (the wrapper rotates
at position + 1, twice, with the other pairing, or the rotary embedding is
rebuilt from a wrong config) while the snapshot declares the true config.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from .common import (Capture, CaseSpec, Unsupported, base_generator, page_rows,
                     rope_declaration, torch_dtype, unique_positions)

PAGE = 16


@dataclass(frozen=True)
class Family:
    """A model family at a tiny size."""

    config: Callable[[], Any]        # -> a transformers config
    module: str                      # the modeling module (patched)
    lens: Tuple[int, ...] = (30, 47)  # tokens per row at the decode step
    offset: int = 0                  # position of each row's first token
    q_gain: float = 1.0              # > 1: peaked logits


def _llama():
    from transformers import LlamaConfig
    return LlamaConfig(vocab_size=64, hidden_size=128, intermediate_size=128,
                       num_hidden_layers=1, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=64,
                       max_position_embeddings=131072,
                       rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0,
                                        "factor": 8.0, "low_freq_factor": 1.0,
                                        "high_freq_factor": 4.0,
                                        "original_max_position_embeddings": 8192})


def _qwen2():
    from transformers import Qwen2Config
    return Qwen2Config(vocab_size=64, hidden_size=256, intermediate_size=128,
                       num_hidden_layers=1, num_attention_heads=4,
                       num_key_value_heads=2, max_position_embeddings=32768,
                       rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})


def _qwen3():
    from transformers import Qwen3Config
    return Qwen3Config(vocab_size=64, hidden_size=128, intermediate_size=128,
                       num_hidden_layers=1, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=64, max_position_embeddings=40960,
                       rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})


def _gemma2():
    from transformers import Gemma2Config
    return Gemma2Config(vocab_size=64, hidden_size=128, intermediate_size=128,
                        num_hidden_layers=2, num_attention_heads=2,
                        num_key_value_heads=1, head_dim=256, sliding_window=16,
                        query_pre_attn_scalar=224, attn_logit_softcapping=50.0,
                        final_logit_softcapping=None, max_position_embeddings=8192)


def _phi3():
    from transformers import Phi3Config
    return Phi3Config(vocab_size=64, hidden_size=256, intermediate_size=128,
                      num_hidden_layers=1, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=32768,
                      original_max_position_embeddings=32768,
                      rope_parameters={"rope_theta": 10000.0,
                                       "partial_rotary_factor": 0.5},
                      pad_token_id=0, bos_token_id=1, eos_token_id=2)


# LongRoPE divisors shaped like Phi-3.5-mini's (32 pairs: head_dim 64).
_SHORT_FACTOR = [round(1.0 + 0.002 * i + 0.6 * (i / 31) ** 4, 4) for i in range(32)]
_LONG_FACTOR = [round(1.0 + 0.5 * i / 31 + 40.0 * (i / 31) ** 3, 4) for i in range(32)]


def _phi3_longrope():
    """Phi-3.5-style LongRoPE: 4k pre-training, 128k context, no factor in
    the config (Hugging Face derives 131072 / 4096 for the attention
    factor)."""
    from transformers import Phi3Config
    return Phi3Config(vocab_size=64, hidden_size=256, intermediate_size=128,
                      num_hidden_layers=1, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=131072,
                      original_max_position_embeddings=4096,
                      rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                       "short_factor": list(_SHORT_FACTOR),
                                       "long_factor": list(_LONG_FACTOR)},
                      pad_token_id=0, bos_token_id=1, eos_token_id=2)


def _gpt_oss():
    from transformers import GptOssConfig
    # YaRN as GPT-OSS ships it (truncate False: see the README).
    return GptOssConfig(vocab_size=64, hidden_size=128, intermediate_size=128,
                        num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=64, num_local_experts=4,
                        num_experts_per_tok=2, sliding_window=24,
                        max_position_embeddings=131072,
                        rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0,
                                         "factor": 32.0, "beta_fast": 32.0,
                                         "beta_slow": 1.0, "truncate": False,
                                         "original_max_position_embeddings": 4096})


FAMILIES: Dict[str, Family] = {
    "llama": Family(_llama, "transformers.models.llama.modeling_llama", offset=100000),
    "qwen2": Family(_qwen2, "transformers.models.qwen2.modeling_qwen2", offset=20000),
    "qwen3": Family(_qwen3, "transformers.models.qwen3.modeling_qwen3", offset=5000),
    "gemma2": Family(_gemma2, "transformers.models.gemma2.modeling_gemma2",
                     lens=(30, 45), q_gain=12.0),
    "phi3": Family(_phi3, "transformers.models.phi3.modeling_phi3", offset=30000),
    # Long factors at 30000 (past 4096); a case with offset 100 gets short.
    "phi3-longrope": Family(_phi3_longrope, "transformers.models.phi3.modeling_phi3",
                            offset=30000),
    "gptoss": Family(_gpt_oss, "transformers.models.gpt_oss.modeling_gpt_oss",
                     offset=70000),
}


# ----------------------------------------------------------------------
# The model
# ----------------------------------------------------------------------


@functools.lru_cache(maxsize=4)
def build_model(family: str, dtype_name: str, impl: str, seed: int):
    """The family's tiny model in the dtype, attention `impl`, with weights
    scaled so that q and K have unit-size elements (q_gain more for q)."""
    import torch
    torch.set_num_threads(1)
    from transformers import AutoModelForCausalLM
    fam = FAMILIES[family]
    cfg = fam.config()
    torch.manual_seed(1000 + seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch_dtype(dtype_name),
                                             attn_implementation=impl)
    model.eval()
    hidden = cfg.hidden_size
    with torch.no_grad():
        for layer in model.model.layers:
            attn = layer.self_attn
            projections = {"q_proj": fam.q_gain, "k_proj": 1.0, "v_proj": 1.0}
            if hasattr(attn, "qkv_proj"):                      # Phi-3: fused
                w = attn.qkv_proj.weight
                w.copy_(torch.randn(w.shape) / hidden ** 0.5)
                w[: cfg.num_attention_heads * attn.head_dim] *= fam.q_gain
                projections = {}
            for name, gain in projections.items():
                w = getattr(attn, name).weight
                w.copy_(torch.randn(w.shape) * gain / hidden ** 0.5)
            if hasattr(attn, "sinks"):
                # bf16-exact sinks with real mass.
                attn.sinks.copy_((2.0 + torch.randn(attn.sinks.shape))
                                 .to(torch.bfloat16).to(attn.sinks.dtype))
    return model


def true_rope(cfg) -> Dict[str, Any]:
    """The model's RoPE config in attnaudit terms (HF rotates NeoX-style)."""
    params = dict(cfg.rope_parameters)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    rotary_dim = int(head_dim * params.get("partial_rotary_factor", 1.0))
    out = {"theta": params["rope_theta"], "style": "neox", "rotary_dim": rotary_dim}
    kind = params.get("rope_type", "default")
    if kind != "default":
        out["scaling"] = {k: v for k, v in params.items()
                          if k not in ("rope_theta", "partial_rotary_factor")}
    if kind == "longrope":  # its default factor (snapshot_args adds the length)
        out["scaling"]["max_position_embeddings"] = cfg.max_position_embeddings
    return out


def true_scale(cfg) -> float:
    """The model's softmax scale: query_pre_attn_scalar ** -0.5 (Gemma2) or
    head_dim ** -0.5."""
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return float(getattr(cfg, "query_pre_attn_scalar", None) or head_dim) ** -0.5


def sliding_window(cfg, layer: int) -> int:
    types = getattr(cfg, "layer_types", None)
    if types and types[layer] == "sliding_attention":
        return int(cfg.sliding_window)
    return 0


# ----------------------------------------------------------------------
# Capture
# ----------------------------------------------------------------------


@dataclass
class Call:
    """One layer's attention call as the wrappers saw it."""

    layer: int
    q_pre: Any = None            # [1, H, S, D] before RoPE
    k_pre: Any = None            # [1, Hkv, S, D] before RoPE
    q: Any = None                # [1, H, S, D] as attention got it
    k: Any = None                # [1, Hkv, K, D] the cache as attention read it
    v: Any = None
    mask: Any = None
    kwargs: Dict[str, Any] = field(default_factory=dict)
    out: Any = None              # [1, S, H, D] before o_proj


class Recorder:
    """Patches the modeling module's apply_rotary_pos_emb and the attention
    function for the duration of a `with`, recording every call, and lets a
    RoPE bug replace the rotation."""

    def __init__(self, module_name: str, impl: str, rope_bug=None):
        self.mod = importlib.import_module(module_name)
        self.impl = impl
        self.rope_bug = rope_bug     # (orig, q, k, cos, sin, state) -> (q', k')
        self.calls: List[Call] = []
        self.positions = None        # position_ids of the forward running
        self._pending: List[Tuple[Any, Any]] = []

    def _rope(self, orig):
        def wrapper(q, k, cos, sin, *args, **kwargs):
            self._pending.append((q.detach().clone(), k.detach().clone()))
            if self.rope_bug is not None:
                return self.rope_bug(orig, q, k, cos, sin, self, *args, **kwargs)
            return orig(q, k, cos, sin, *args, **kwargs)
        return wrapper

    def _attention(self, orig):
        def wrapper(module, query, key, value, attention_mask, *args, **kwargs):
            out = orig(module, query, key, value, attention_mask, *args, **kwargs)
            q_pre, k_pre = self._pending.pop() if self._pending else (None, None)
            self.calls.append(Call(
                layer=module.layer_idx, q_pre=q_pre, k_pre=k_pre,
                q=query.detach().clone(), k=key.detach().clone(),
                v=value.detach().clone(),
                mask=None if attention_mask is None else attention_mask.detach().clone(),
                kwargs={k: v for k, v in kwargs.items()
                        if k in ("scaling", "softcap", "sliding_window", "s_aux", "dropout")},
                out=out[0].detach().clone()))
            return out
        return wrapper

    @contextlib.contextmanager
    def active(self):
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS as FUNCS
        orig_rope = self.mod.apply_rotary_pos_emb
        self.mod.apply_rotary_pos_emb = self._rope(orig_rope)
        if self.impl == "eager":
            orig_attn = self.mod.eager_attention_forward
            self.mod.eager_attention_forward = self._attention(orig_attn)
        else:
            had_local = self.impl in FUNCS._local_mapping
            previous = FUNCS._local_mapping.get(self.impl)
            FUNCS[self.impl] = self._attention(FUNCS[self.impl])
        try:
            yield self
        finally:
            self.mod.apply_rotary_pos_emb = orig_rope
            if self.impl == "eager":
                self.mod.eager_attention_forward = orig_attn
            elif had_local:
                FUNCS[self.impl] = previous
            else:
                del FUNCS[self.impl]


def run_row(model, recorder: Recorder, L: int, first_position: int, g):
    """Prefill L - 1 tokens, decode one; returns (decode calls by layer,
    pre-RoPE keys of every token by layer [Hkv, L, D], positions [L])."""
    import torch
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (1, L), generator=g)
    pos = first_position + torch.arange(L, dtype=torch.int64)[None]
    with torch.no_grad(), recorder.active():
        recorder.positions = pos[:, :-1]
        out = model(input_ids=ids[:, :-1], position_ids=pos[:, :-1], use_cache=True)
        prefill = len(recorder.calls)
        recorder.positions = pos[:, -1:]
        model(input_ids=ids[:, -1:], position_ids=pos[:, -1:],
              past_key_values=out.past_key_values, use_cache=True)
    calls = recorder.calls
    decode = {c.layer: c for c in calls[prefill:]}
    pre_k = {c.layer: torch.cat([c.k_pre[0], decode[c.layer].k_pre[0]], dim=1)
             for c in calls[:prefill]}
    recorder.calls = []
    return decode, pre_k, pos[0]


# ----------------------------------------------------------------------
# RoPE bugs (engine side)
# ----------------------------------------------------------------------


def _rotate_gptj(x, cos, sin):
    """GPT-J interleaved pairing, each op in x's dtype (HF's GPT-J code):
    cos/sin given NeoX-style, [.., rotary_dim] = cat(f, f) or [.., rd/2]."""
    import torch
    half = x.shape[-1] // 2
    c = cos[..., :half] if cos.shape[-1] == x.shape[-1] else cos
    s = sin[..., :half] if sin.shape[-1] == x.shape[-1] else sin
    c = c.repeat_interleave(2, dim=-1)
    s = s.repeat_interleave(2, dim=-1)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    rot = torch.stack((-x2, x1), dim=-1).flatten(-2)
    return (x * c) + (rot * s)


def rope_bug_hook(bug: str, model):
    """The apply_rotary_pos_emb replacement of a RoPE bug, or None."""
    rotary = model.model.rotary_emb

    def offset(orig, q, k, cos, sin, rec, *args, **kwargs):
        c1, s1 = rotary(q, rec.positions + 1)            # q at position + 1
        return orig(q, k, c1, s1, *args, **kwargs)[0], orig(q, k, cos, sin, *args, **kwargs)[1]

    def twice(orig, q, k, cos, sin, rec, *args, **kwargs):
        q2, k2 = orig(q, k, cos, sin, *args, **kwargs)
        return q2, orig(k2, k2, cos, sin, *args, **kwargs)[1]   # K rotated again

    def style(orig, q, k, cos, sin, rec, *args, **kwargs):
        c, s = cos.unsqueeze(1), sin.unsqueeze(1)
        return _rotate_gptj(q, c, s), _rotate_gptj(k, c, s)

    return {"rope-offset": offset, "k-rope-twice": twice, "rope-style": style}.get(bug)


def engine_rope_config(bug: str, cfg):
    """The config an engine with a RoPE-table bug built its rotary embedding
    from, or None (the model's)."""
    params = dict(cfg.rope_parameters)
    if bug == "rope-theta":
        params["rope_theta"] = 10000.0 if params["rope_theta"] != 10000.0 else 500000.0
    elif bug == "rope-scaling-ignored":
        params = {"rope_type": "default", "rope_theta": params["rope_theta"],
                  **({"partial_rotary_factor": params["partial_rotary_factor"]}
                     if "partial_rotary_factor" in params else {})}
    elif bug == "rope-partial-rotary":
        params["partial_rotary_factor"] = 1.0
    elif bug == "rope-scaling-length":   # LongRoPE's short factors past 4k
        params["long_factor"] = list(params["short_factor"])
    else:
        return None
    wrong = copy.deepcopy(cfg)
    wrong.rope_parameters = params
    return wrong


@contextlib.contextmanager
def engine_rotary(model, bug: Optional[str]):
    """Swaps the model's rotary embedding for the one a RoPE-table bug (or
    the inv_freq-in-bf16 behaviour) builds, restoring it afterwards."""
    import torch
    original = model.model.rotary_emb
    wrong_cfg = engine_rope_config(bug, model.config) if bug else None
    if wrong_cfg is not None:
        model.model.rotary_emb = type(original)(config=wrong_cfg)
    elif bug == "inv-freq-bf16":
        # What `model.to(torch.bfloat16)` does: the non-persistent inv_freq
        # buffer is cast too (from_pretrained / from_config keep it fp32).
        patched = copy.deepcopy(original)
        patched.inv_freq = patched.inv_freq.to(torch.bfloat16)
        model.model.rotary_emb = patched
    try:
        yield model.model.rotary_emb
    finally:
        model.model.rotary_emb = original


# ----------------------------------------------------------------------
# One case
# ----------------------------------------------------------------------


# What this engine injects: RoPE bugs (hooks and rotary embeddings above)
# and the real behaviours it shows (nothing injected for those).
BUGS = {None, "rope-offset", "k-rope-twice", "rope-style", "rope-theta",
        "rope-scaling-ignored", "rope-scaling-length", "rope-partial-rotary",
        "inv-freq-bf16", "sdpa-drops-softcap"}


def capture(spec: CaseSpec) -> Capture:
    """Runs one case on a Hugging Face model (see the module docstring)."""
    import torch
    impl = {"hf-eager": "eager", "hf-sdpa": "sdpa"}[spec.engine]
    fam = FAMILIES[spec.model]
    if spec.model == "gptoss" and impl == "sdpa":
        raise Unsupported("GptOss has no sdpa attention (_supports_sdpa = False)")
    if spec.dtype.startswith("fp8"):
        raise Unsupported("transformers' dynamic cache has no fp8 KV")
    if spec.bug not in BUGS:
        raise ValueError(f"hf: no injection for bug {spec.bug!r}")
    model = build_model(spec.model, spec.dtype, impl, spec.seed)
    cfg = model.config
    offset = fam.offset if spec.offset is None else spec.offset
    g = base_generator(spec, 1)
    recorder = Recorder(fam.module, impl, rope_bug_hook(spec.bug, model) if spec.bug else None)

    rows = []
    with engine_rotary(model, spec.bug) as rotary:
        for b, L in enumerate(fam.lens):
            decode, pre_k, pos = run_row(model, recorder, L, offset + 13 * b, g)
            rows.append(_row(decode[spec.layer], pre_k[spec.layer], pos))
        table = (_rope_table(spec.rope_table, rotary, rows)
                 if spec.rope_table else None)

    args = snapshot_args(spec, cfg, rows, base_generator(spec, 2))
    if table is not None:
        args["rope_table"] = table
    call0 = rows[0]["call"]
    info = {"impl": impl, "layer": spec.layer, "offset": offset,
            "keys_seen": [int(r["k"].shape[0]) for r in rows],
            "kwargs": {k: (float(v) if isinstance(v, (int, float)) else
                           None if v is None else str(type(v).__name__))
                       for k, v in call0.kwargs.items()}}
    return Capture(args=args, location=None, info=info)


def _row(call: Call, pre_k, pos) -> Dict[str, Any]:
    """One row's decode call: q, K/V as attention read them ([K, Hkv, D]),
    their positions (the last K tokens: what the cache kept), pre-RoPE
    values and the output."""
    K = int(call.k.shape[2])
    _check_mask(call, K)
    return {"call": call, "q": call.q[0, :, 0], "q_pre": call.q_pre[0, :, 0],
            "k": call.k[0].transpose(0, 1), "v": call.v[0].transpose(0, 1),
            "k_pre": pre_k[:, -K:].transpose(0, 1), "k_pre_new": call.k_pre[0, :, 0],
            "positions": pos[-K:], "qpos": int(pos[-1]), "out": call.out[0, 0]}


def _check_mask(call: Call, K: int) -> None:
    """The decode mask must hide nothing of what attention read: the
    window is applied by the cache (last W tokens), and the snapshot
    declares it, so the two agree."""
    import torch
    if call.mask is None:
        return
    m = call.mask.reshape(-1)[-K:]
    hidden = int((~m).sum()) if m.dtype == torch.bool else int((m < -1e4).sum())
    if hidden:
        raise AssertionError(f"layer {call.layer}: the decode mask hides {hidden} of "
                             f"{K} keys; the capture assumes none")


def snapshot_args(spec: CaseSpec, cfg, rows, g) -> Dict[str, Any]:
    """from_paged_kv's arguments: what a correct capture hook sends."""
    import torch
    mode = spec.mode
    pre_k = mode == "pre-qk"
    paged = page_rows([r["k_pre" if pre_k else "k"] for r in rows],
                      [r["v"] for r in rows], PAGE, "hnd", g)
    T = max(int(r["positions"].shape[0]) for r in rows)
    key_pos = torch.stack([torch.cat([r["positions"],
                                      r["positions"][-1] + 1 + torch.arange(T - len(r["positions"]))])
                           for r in rows])
    call = rows[0]["call"]
    args: Dict[str, Any] = dict(
        q=torch.stack([r["q_pre" if mode in ("pre-q", "pre-qk") else "q"] for r in rows]),
        k_cache=paged.k_pool, v_cache=paged.v_pool, layout="hnd",
        block_table=paged.block_table, seq_lens=paged.seq_lens,
        key_positions=key_pos, query_positions=torch.tensor([r["qpos"] for r in rows]),
        engine=spec.engine, engine_out=torch.stack([r["out"] for r in rows]),
        softmax_scale=true_scale(cfg),
        rope=rope_declaration(_step_rope(cfg, rows), mode),
        labels={"model": f"{spec.model}-tiny", "engine": spec.engine,
                "backend": f"transformers/{spec.engine[3:]}", "layer": spec.layer,
                "step": 0})
    softcap = getattr(cfg, "attn_logit_softcapping", None)
    if softcap:
        args["logit_softcap"] = float(softcap)   # the model's, even where sdpa drops it
    window = sliding_window(cfg, spec.layer)
    if window:
        args.update(sliding_window=window, window_convention="hf")
    sinks = call.kwargs.get("s_aux")
    if sinks is not None:
        args["sinks"] = sinks.detach().to(torch.float32)
    if mode == "post+rolling":
        args["pre_rope_q"] = torch.stack([r["q_pre"] for r in rows])
        args["pre_rope_k"] = torch.stack([r["k_pre_new"] for r in rows])
    return args


def _step_rope(cfg, rows) -> Dict[str, Any]:
    """true_rope plus, for LongRoPE, the length Hugging Face scaled for:
    each row is its own request, its step's largest position + 1 (the rows
    lie on one side of original_max_position, so one length serves)."""
    rope = true_rope(cfg)
    scaling = rope.get("scaling")
    if scaling and scaling.get("rope_type") == "longrope":
        scaling["sequence_length"] = max(r["qpos"] for r in rows) + 1
    return rope


def _rope_table(kind: str, rotary, rows) -> Dict[str, Any]:
    """The engine's RoPE values: its inv_freq (fp32), or the cos/sin rows
    its rotary embedding produces for the step's positions (model dtype,
    rotary_dim / 2 wide)."""
    import torch
    if kind == "inv_freq":
        return {"inv_freq": rotary.inv_freq.to(torch.float32)}
    pos = unique_positions(*[r["positions"] for r in rows],
                           torch.tensor([r["qpos"] for r in rows]))
    dtype = rows[0]["q"].dtype
    cos, sin = rotary(torch.zeros(1, dtype=dtype), pos[None])
    half = int(rotary.inv_freq.shape[0])
    return {"positions": pos, "cos": cos[0, :, :half].contiguous(),
            "sin": sin[0, :, :half].contiguous()}
