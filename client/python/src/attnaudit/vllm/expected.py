"""What a model's configuration fixes about its attention layers.

A snapshot declares the scale, soft-cap, window and sinks the kernel was
given, read from the layer at run time: an engine that built a layer
wrongly (a scale off by a factor, a soft-cap or a window dropped, a
model's sinks not loaded) computes exactly what it declares, and its
audits PASS. The model's configuration says what the layers should be,
independently of the engine; `Expected.mismatches` compares one layer's
call with it. A mismatch is a finding beside the verdict, not a verdict:
the configuration can be deliberately overridden (e.g. vLLM's
disable_sliding_window).

Only what the configuration states is checked. Unknown (None) fields are
skipped: a window only where the configuration lists its layer types,
sinks only for architectures that always have them, a scale not for
multi-head latent attention (its YaRN mscale scales it too).

Thread safety: Expected is immutable.
"""

from __future__ import annotations

import dataclasses
from typing import Any, List, Optional, Tuple

# Architectures whose every attention layer has learned sinks.
_SINK_MODELS = frozenset({"gpt_oss"})

# The relative difference under which two scales or caps are the same
# number written in two ways (a float32 attribute against a float64 one).
_SAME = 1e-6


@dataclasses.dataclass(frozen=True)
class Expected:
    """The configuration's attention, per layer where it varies.

    scale: the softmax scale; soft_cap: the logit soft-cap, 0.0 for none
    (None: the configuration does not say); head_dim, num_heads: sizes
    (num_heads across all tensor-parallel ranks); windows: per layer, the
    sliding window or 0 for full attention (None where a layer's type is
    not a plain full/sliding one, or the configuration lists no types);
    sinks: whether layers have learned sinks (None: not known)."""

    scale: Optional[float] = None
    soft_cap: Optional[float] = None
    head_dim: Optional[int] = None
    num_heads: Optional[int] = None
    windows: Optional[Tuple[Optional[int], ...]] = None
    sinks: Optional[bool] = None

    @classmethod
    def from_config(cls, hf_config: Any) -> "Expected":
        """From a transformers configuration (vLLM's hf_text_config)."""
        if hf_config is None:
            return cls()
        return cls(scale=config_softmax_scale(hf_config),
                   soft_cap=_soft_cap(hf_config),
                   head_dim=_head_dim(hf_config),
                   num_heads=_int_or_none(getattr(hf_config, "num_attention_heads", None)),
                   windows=_windows(hf_config),
                   sinks=_sinks(hf_config))

    def mismatches(self, layer: int, *, scale: float, soft_cap: Optional[float],
                   window: Optional[int], has_sinks: bool, head_dim: int,
                   num_heads: int) -> List[str]:
        """How layer `layer`, as the engine built it, differs from the
        configuration: one phrase per quantity ("soft-cap none, the
        configuration's 50"); empty when it agrees."""
        found: List[str] = []
        if self.scale is not None and not _same(scale, self.scale):
            found.append(f"softmax scale {scale:.6g}, the configuration's {self.scale:.6g}")
        cap = float(soft_cap or 0.0)
        if self.soft_cap is not None and not _same(cap, self.soft_cap):
            found.append(f"soft-cap {_or_none(cap)}, the configuration's "
                         f"{_or_none(self.soft_cap)}")
        want_window = self._window(layer)
        have_window = int(window) if window and window > 0 else 0
        if want_window is not None and have_window != want_window:
            found.append(f"window {_or_none(have_window)}, the configuration's "
                         f"{_or_none(want_window)}")
        if self.sinks is not None and has_sinks != self.sinks:
            found.append("sinks present, the configuration has none" if has_sinks
                         else "no sinks, the configuration's architecture has them")
        if self.head_dim is not None and head_dim != self.head_dim:
            found.append(f"head size {head_dim}, the configuration's {self.head_dim}")
        if self.num_heads is not None and (num_heads <= 0 or self.num_heads % num_heads):
            # Tensor parallelism splits the heads evenly: a rank's count
            # divides the model's.
            found.append(f"{num_heads} query heads, which do not divide the "
                         f"configuration's {self.num_heads}")
        return found

    def _window(self, layer: int) -> Optional[int]:
        if self.windows is None or not 0 <= layer < len(self.windows):
            return None
        return self.windows[layer]


def config_softmax_scale(hf_config: Any) -> Optional[float]:
    """The softmax scale a model's configuration implies: Granite's
    attention_multiplier, else query_pre_attn_scalar ** -0.5 (Gemma), else
    head_dim ** -0.5. None where the configuration does not fix it alone
    (multi-head latent attention, whose YaRN mscale also scales it) or
    lacks the sizes."""
    if hf_config is None or getattr(hf_config, "kv_lora_rank", None):
        return None
    multiplier = getattr(hf_config, "attention_multiplier", None)
    if multiplier:
        return float(multiplier)
    scalar = getattr(hf_config, "query_pre_attn_scalar", None)
    if scalar:
        return float(scalar) ** -0.5
    head_dim = _head_dim(hf_config)
    return None if head_dim is None else float(head_dim) ** -0.5


def _head_dim(hf_config: Any) -> Optional[int]:
    if getattr(hf_config, "kv_lora_rank", None):
        return None  # MLA: the kernel's head size is not head_dim
    head_dim = _int_or_none(getattr(hf_config, "head_dim", None))
    if head_dim:
        return head_dim
    hidden = _int_or_none(getattr(hf_config, "hidden_size", None))
    heads = _int_or_none(getattr(hf_config, "num_attention_heads", None))
    return hidden // heads if hidden and heads else None


def _soft_cap(hf_config: Any) -> Optional[float]:
    # Only a configuration that has the field says anything about it
    # (Gemma 2: 50.0; Gemma 3: None, i.e. none).
    if not hasattr(hf_config, "attn_logit_softcapping"):
        return None
    return float(hf_config.attn_logit_softcapping or 0.0)


def _windows(hf_config: Any) -> Optional[Tuple[Optional[int], ...]]:
    types = getattr(hf_config, "layer_types", None)
    if not isinstance(types, (list, tuple)) or not types:
        return None
    window = _int_or_none(getattr(hf_config, "sliding_window", None))
    out: List[Optional[int]] = []
    for kind in types:
        if kind == "full_attention":
            out.append(0)
        elif kind == "sliding_attention" and window:
            out.append(window)
        else:  # chunked, linear, or a sliding layer without its size
            out.append(None)
    return tuple(out)


def _sinks(hf_config: Any) -> Optional[bool]:
    return True if getattr(hf_config, "model_type", None) in _SINK_MODELS else None


def _int_or_none(v: Any) -> Optional[int]:
    try:
        return int(v) if v is not None else None
    except (TypeError, ValueError):
        return None


def _same(a: float, b: float) -> bool:
    return abs(a - b) <= _SAME * max(abs(a), abs(b))


def _or_none(v: float) -> str:
    return "none" if not v else f"{v:g}"
