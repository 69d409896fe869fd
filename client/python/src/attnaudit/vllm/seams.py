"""Where the plugin meets vLLM: three class-level wraps, installed once.

  * the attention backend's forward() (CPU_ATTN on a CPU platform;
    FLASH_ATTN and FLASHINFER on CUDA): after the kernel ran, the call's
    tensors go to VllmAuditPlugin.on_attention; the first call with a real
    cache (vLLM's warm-up) probes the backend's arithmetic once
    (VllmAuditPlugin.warm_up; never while compiling or capturing a CUDA
    graph);
  * RotaryEmbeddingBase.forward: before RoPE rotates q and k (in place on
    the CPU), the sampled decode rows are copied for the rolling check; the
    first module seen is kept for the probe, which rotates with it;
  * GPUModelRunner.execute_model (the CPU runner inherits it): remembers the
    runner, for the request ids of the batch rows and the model config.

Every name of vLLM this module relies on is read here and nowhere else; a
vLLM release that renames one makes install() log what it could not wrap
and go on without it. Tested end to end on vLLM's CPU backend
(tests/vllm_plugin); the CUDA backends' wraps are written from their code
and have not run on a GPU.

Thread safety: the wraps run on the engine's thread. Errors inside them go
to VllmAuditPlugin.error(), never to the engine.
"""

from __future__ import annotations

import logging
from typing import Any, List, Optional

from .capture import AttentionCall, backend_key, config_softmax_scale, model_label
from .plugin import VllmAuditPlugin, layer_index

log = logging.getLogger("attnaudit.vllm")

_PLUGIN: Optional[VllmAuditPlugin] = None
_RUNNER: List[Any] = [None]
_WRAPPED = "_attnaudit_wrapped"

# (backend label, module, class) per platform.
_CPU_BACKENDS = [("cpu_attn", "vllm.v1.attention.backends.cpu_attn",
                  "CPUAttentionBackendImpl")]
_CUDA_BACKENDS = [("flash_attn", "vllm.v1.attention.backends.flash_attn",
                   "FlashAttentionImpl"),
                  ("flashinfer", "vllm.v1.attention.backends.flashinfer",
                   "FlashInferImpl")]


def install(plugin: VllmAuditPlugin) -> List[str]:
    """Wraps vLLM's seams for `plugin`; returns what was wrapped."""
    global _PLUGIN
    _PLUGIN = plugin
    done = []
    if _wrap("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "execute_model",
             _runner_wrapper):
        done.append("model runner")
    if _wrap("vllm.model_executor.layers.rotary_embedding.base", "RotaryEmbeddingBase",
             "forward", _rotary_wrapper):
        done.append("rotary embedding")
    for backend, module, cls in _backends():
        if _wrap(module, cls, "forward", lambda f, b=backend: _attention_wrapper(f, b)):
            done.append(backend)
    return done


def uninstall() -> None:
    """Restores vLLM's own methods (the overhead benchmark's "off")."""
    global _PLUGIN
    import importlib
    targets = [("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "execute_model"),
               ("vllm.model_executor.layers.rotary_embedding.base",
                "RotaryEmbeddingBase", "forward")]
    targets += [(module, cls, "forward") for _, module, cls in _backends()]
    for module, cls, method in targets:
        try:
            klass = getattr(importlib.import_module(module), cls)
        except Exception:  # noqa: BLE001 - never wrapped
            continue
        current = klass.__dict__.get(method)
        if getattr(current, _WRAPPED, False):
            setattr(klass, method, current.__wrapped__)
    _PLUGIN = None


def _backends():
    try:
        from vllm.platforms import current_platform
        if current_platform.is_cpu():
            return _CPU_BACKENDS
        if current_platform.is_cuda():
            return _CUDA_BACKENDS
    except Exception as e:  # noqa: BLE001 - a vLLM without the platform API
        log.warning("attnaudit plugin: cannot tell vLLM's platform (%s)", e)
    return []


def _wrap(module: str, cls: str, method: str, make) -> bool:
    try:
        import importlib
        klass = getattr(importlib.import_module(module), cls)
        original = getattr(klass, method)
    except Exception as e:  # noqa: BLE001 - not in this vLLM release
        log.warning("attnaudit plugin: %s.%s.%s not found (%s); not audited there",
                    module, cls, method, e)
        return False
    if getattr(original, _WRAPPED, False):
        return True
    wrapped = make(original)
    setattr(wrapped, _WRAPPED, True)
    wrapped.__wrapped__ = original
    wrapped.__name__ = getattr(original, "__name__", method)
    wrapped.__doc__ = getattr(original, "__doc__", None)
    setattr(klass, method, wrapped)
    return True


# ----------------------------------------------------------------------


def _runner_wrapper(original):
    def execute_model(self, *args, **kwargs):
        if _RUNNER[0] is not self:
            _RUNNER[0] = self
            _learn_model(self)
        return original(self, *args, **kwargs)
    return execute_model


def _rotary_wrapper(original):
    def forward(self, positions, query, key=None, *args, **kwargs):
        p = _PLUGIN
        if p is not None and not _compiling():
            if p.rope_module is None:
                p.rope_module = self
            try:
                st = _state()
                if st is not None and st.sampled:
                    p.on_rotary(st, {"theta": float(self.base),
                                     "rotary_dim": int(self.rotary_dim),
                                     "neox": bool(self.is_neox_style)}, query, key,
                                module=self)
            except Exception as e:  # noqa: BLE001
                p.error("pre-RoPE capture", e)
        return original(self, positions, query, key, *args, **kwargs)
    return forward


def _attention_wrapper(original, backend: str):
    def forward(self, layer, query, key, value, kv_cache, attn_metadata, *args, **kwargs):
        result = original(self, layer, query, key, value, kv_cache, attn_metadata,
                          *args, **kwargs)
        p = _PLUGIN
        if p is not None and p.needs_probe:
            _probe_backend(p, self, backend, layer, query, kv_cache)
        if p is not None and attn_metadata is not None:
            try:
                st = _state()
                if st is not None and st.sampled:
                    output = kwargs.get("output", args[0] if args else None)
                    call = _attention_call(self, backend, layer, query, kv_cache,
                                           attn_metadata, result if output is None else output)
                    if call is not None:
                        p.on_attention(st, call)
            except Exception as e:  # noqa: BLE001
                p.error(f"{backend} capture", e)
        return result
    return forward


def _probe_backend(p: VllmAuditPlugin, impl, backend: str, layer, query, kv_cache) -> None:
    """On the first attention call with a real cache (vLLM's warm-up, after
    the profile run): the engine probe for this backend, once."""
    if _compiling() or _capturing() or kv_cache is None or kv_cache.dim() != 4 \
            or kv_cache.numel() == 0:
        return
    try:
        call = AttentionCall(
            backend=backend, layer=0, query=query.view(query.shape[0], -1, impl.head_size),
            kv_cache=kv_cache, block_table=None, seq_lens=None, query_start_loc=None,
            output=None, scale=float(impl.scale),
            kv_cache_dtype=str(getattr(impl, "kv_cache_dtype", "auto")),
            isa=getattr(layer, "isa", None))
        p.warm_up(backend_key(call))
    except Exception as e:  # noqa: BLE001
        p.needs_probe = False
        p.error("engine probe", e)


def _attention_call(impl, backend: str, layer, query, kv_cache, md,
                    output) -> Optional[AttentionCall]:
    if str(getattr(impl, "attn_type", "decoder")) not in ("decoder", "AttentionType.DECODER"):
        return None
    index = layer_index(str(getattr(layer, "layer_name", "")))
    if index is None:
        return None
    window = getattr(impl, "sliding_window", None)
    if isinstance(window, (tuple, list)):  # FlashAttention: (left, right)
        window = int(window[0]) + 1 if int(window[0]) >= 0 else None
    cap = getattr(impl, "logits_soft_cap", None)
    return AttentionCall(
        backend=backend, layer=index, query=query, kv_cache=kv_cache,
        block_table=md.block_table, seq_lens=md.seq_lens,
        query_start_loc=md.query_start_loc, output=output, scale=float(impl.scale),
        sliding_window=window, logits_soft_cap=cap or None,
        sinks=getattr(impl, "sinks", None),
        kv_cache_dtype=str(getattr(impl, "kv_cache_dtype", "auto")),
        k_scale=float(getattr(layer, "_k_scale_float", 1.0)),
        v_scale=float(getattr(layer, "_v_scale_float", 1.0)),
        isa=getattr(layer, "isa", None))


# ----------------------------------------------------------------------


def _state():
    from vllm.forward_context import get_forward_context, is_forward_context_available
    if not is_forward_context_available():
        return None
    ctx = get_forward_context()
    return _PLUGIN.state(ctx, lambda: _metadata(ctx), lambda: _layer_names(ctx),
                         _request_ids)


def _metadata(ctx):
    md = getattr(ctx, "attn_metadata", None)
    if not isinstance(md, dict):  # None (warm-up) or micro-batches: skipped
        return None
    for value in md.values():
        if hasattr(value, "query_start_loc") and hasattr(value, "seq_lens"):
            return value
    return None


def _layer_names(ctx) -> List[str]:
    layers = getattr(ctx, "no_compile_layers", None) or {}
    return [name for name, module in layers.items() if hasattr(module, "impl")]


def _request_ids():
    runner = _RUNNER[0]
    batch = getattr(runner, "input_batch", None)
    return list(batch.req_ids) if batch is not None else None


def _learn_model(runner) -> None:
    config = getattr(runner, "model_config", None)
    if config is None:
        return
    if _PLUGIN.model is None:
        name = getattr(config, "served_model_name", None) or getattr(config, "model", None)
        _PLUGIN.model = model_label(
            str(name[0] if isinstance(name, (list, tuple)) else name))
    hf = getattr(config, "hf_text_config", None) or getattr(config, "hf_config", None)
    params = getattr(hf, "rope_parameters", None) or getattr(hf, "rope_scaling", None)
    _PLUGIN.rope_parameters = dict(params) if params else None
    _PLUGIN.config_scale = config_softmax_scale(hf)


def _capturing() -> bool:
    """Inside a CUDA graph capture: nothing extra may run."""
    try:
        import torch
        return bool(torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())
    except Exception:  # noqa: BLE001
        return False


def _compiling() -> bool:
    try:
        import torch
        return bool(torch.compiler.is_compiling())
    except Exception:  # noqa: BLE001
        return False
