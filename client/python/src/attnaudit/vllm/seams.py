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
    runner, for the request ids of the batch rows and the model config;
  * WorkerBase gains attnaudit_set_rl_step, for collective_rpc.

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

from .capture import AttentionCall, backend_key, model_label
from .expected import Expected
from .plugin import VllmAuditPlugin, layer_index

log = logging.getLogger("attnaudit.vllm")

# The method an RL loop calls on every worker to label later snapshots
# with its step: llm.collective_rpc("attnaudit_set_rl_step", args=(step,)).
RL_STEP_METHOD = "attnaudit_set_rl_step"

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
    if _add_method("vllm.v1.worker.worker_base", "WorkerBase", RL_STEP_METHOD,
                   _set_rl_step):
        done.append(f"worker.{RL_STEP_METHOD}")
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


def _add_method(module: str, cls: str, name: str, fn) -> bool:
    """Gives vLLM's class a method of ours (an RPC an RL loop can reach
    by name through collective_rpc, which sends no code by default)."""
    try:
        import importlib
        klass = getattr(importlib.import_module(module), cls)
    except Exception as e:  # noqa: BLE001 - not in this vLLM release
        log.warning("attnaudit plugin: %s.%s not found (%s); no %s", module, cls, e, name)
        return False
    setattr(klass, name, fn)
    return True


def _set_rl_step(worker, step, run=None, weight_version=None) -> bool:
    """The workers' attnaudit_set_rl_step: set_rl_step in their process."""
    del worker
    if _PLUGIN is None:
        return False
    _PLUGIN.set_rl_step(step, run, weight_version)
    return True


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
        if p is not None and not p.announced:
            p.announce(backend)
        if p is not None and p.needs_probe:
            _probe_backend(p, self, backend, layer, query, kv_cache)
        if p is not None and p.prefix.block_size == 0 and _real_cache(kv_cache):
            p.learn_cache(kv_cache, backend)
        if p is not None and p.expected is not None and id(layer) not in p.layers_checked:
            _check_layer(p, self, backend, layer, query)
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


def _real_cache(kv_cache) -> bool:
    """A layer's allocated cache (not the profile run's placeholder)."""
    return (kv_cache is not None and kv_cache.dim() in (4, 5) and kv_cache.numel() > 0
            and not _compiling() and not _capturing())


def _probe_backend(p: VllmAuditPlugin, impl, backend: str, layer, query, kv_cache) -> None:
    """On the first attention call with a real cache (vLLM's warm-up, after
    the profile run): the engine probe for this backend, once."""
    if not _real_cache(kv_cache) or kv_cache.dim() != 4:
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


def _check_layer(p: VllmAuditPlugin, impl, backend: str, layer, query) -> None:
    """A layer's first call once the model's configuration is known: its
    scale, soft-cap, window, sinks and sizes against the configuration."""
    p.layers_checked.add(id(layer))
    try:
        call = _attention_call(impl, backend, layer, query, None, None, None)
        if call is not None:
            p.check_config(call, audited=False)
    except Exception as e:  # noqa: BLE001
        p.error("configuration check", e)


def _attention_call(impl, backend: str, layer, query, kv_cache, md,
                    output) -> Optional[AttentionCall]:
    """The call's tensors and the layer's attention parameters as the
    kernel was given them; md None: the parameters only (no batch)."""
    if str(getattr(impl, "attn_type", "decoder")) not in ("decoder", "AttentionType.DECODER"):
        return None
    index = layer_index(str(getattr(layer, "layer_name", "")))
    if index is None:
        return None
    window = getattr(impl, "sliding_window", None)
    if isinstance(window, (tuple, list)):  # FlashAttention: (left, right)
        window = int(window[0]) + 1 if int(window[0]) >= 0 else None
    cap = getattr(impl, "logits_soft_cap", None)
    head_size = int(getattr(impl, "head_size", 0) or query.shape[-1])
    if query.dim() == 2:  # [T, Hq * D]
        query = query.view(query.shape[0], -1, head_size)
    return AttentionCall(
        backend=backend, layer=index, query=query, kv_cache=kv_cache,
        block_table=getattr(md, "block_table", None), seq_lens=getattr(md, "seq_lens", None),
        query_start_loc=getattr(md, "query_start_loc", None), output=output,
        scale=float(impl.scale), sliding_window=window, logits_soft_cap=cap or None,
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
    _PLUGIN.expected = Expected.from_config(hf)


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
