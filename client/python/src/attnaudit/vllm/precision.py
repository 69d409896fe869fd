"""The engine precision the plugin declares: measured once per process and
attention backend by the engine probe (attnaudit.probe), cached, and put on
every snapshot; the preset when the probe cannot run.

The probe runs on the first attention call the seams see (vLLM's warm-up
at start-up, else the first step) with that call's dtype, head size, ISA
and block size, and the model's own rotary module (as the model dispatches
it: the rotary_embedding op with enforce_eager). It costs a few seconds once;
a step afterwards pays one dict lookup, on sampled steps only.

No vLLM import here: the prober is injected (tests use numpy engines).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Any, Callable, Dict, Optional

log = logging.getLogger("attnaudit.vllm")

# The longest row of the probe's long-row check in the plugin: start-up
# stays at seconds (the CLI's default is 32k).
PLUGIN_MAX_KEYS = 4096


@dataclasses.dataclass(frozen=True)
class BackendKey:
    """What decides an attention backend's arithmetic in one process."""

    backend: str            # "cpu_attn", "flash_attn", "flashinfer"
    dtype: str              # the model dtype: "bf16", "f16", "f32"
    head_dim: int
    isa: Optional[str] = None
    block_size: int = 0
    kv_cache_dtype: str = "auto"

    def label(self) -> str:
        parts = [self.backend, self.dtype, f"D{self.head_dim}"]
        if self.isa:
            parts.append(self.isa)
        return " ".join(parts)


@dataclasses.dataclass(frozen=True)
class Declared:
    """What the plugin declares for a backend: precision (an EnginePrecision
    dict; None: the engine preset's, resolved by Snapshot's engine=),
    cast_point (None: the preset's), measured (the probe's, or a fallback),
    line (the evidence, or why the probe failed)."""

    precision: Optional[Dict[str, Any]]
    cast_point: Optional[str]
    measured: bool
    line: str


# (key, rope module or None) -> attnaudit.probe.ProbeResult
Prober = Callable[[BackendKey, Any], Any]


def default_prober(key: BackendKey, rope_module: Any) -> Any:
    """The probe on vLLM's own kernels for `key` (attnaudit.probe.adapters)."""
    from .. import probe
    from ..probe import adapters
    if key.kv_cache_dtype not in ("auto", "", None):
        raise NotImplementedError(f"the probe runs model-dtype caches, not {key.kv_cache_dtype}")
    common: Dict[str, Any] = {"head_dim": key.head_dim, "max_keys": PLUGIN_MAX_KEYS}
    if key.backend == "cpu_attn":
        eng = adapters.vllm_cpu(key.dtype, isa=key.isa, block_size=key.block_size or 128,
                                rope_module=rope_module,
                                rope_path="module" if rope_module is not None else "custom_op",
                                **common)
    elif key.backend == "flash_attn":
        eng = adapters.flash_attn(key.dtype, rope_module=rope_module, **common)
    elif key.backend == "flashinfer":
        eng = adapters.flashinfer(key.dtype, rope_module=rope_module, **common)
    else:
        raise NotImplementedError(f"no probe adapter for backend {key.backend!r}")
    return probe.run(eng)


class PrecisionCache:
    """Per-process: one Declared per BackendKey, probed on first use.

    enabled False: never probes (the preset, resolved by the CPU's ISA).
    Thread-safe; a failed probe is not retried (its fallback is cached and
    logged once)."""

    def __init__(self, enabled: bool = True, prober: Optional[Prober] = None,
                 preset: Optional[Callable[[BackendKey], str]] = None):
        self.enabled = enabled
        self._prober = prober or default_prober
        self._preset = preset or (lambda key: "")
        self._lock = threading.Lock()
        self._done: Dict[BackendKey, Declared] = {}
        self.seconds = 0.0

    def known(self, key: BackendKey) -> bool:
        return key in self._done

    def declarations(self) -> Dict[str, Declared]:
        """Every backend declared so far, by BackendKey.label()."""
        with self._lock:
            return {key.label(): d for key, d in self._done.items()}

    def get(self, key: BackendKey, rope_module: Any = None) -> Declared:
        """The declaration for `key`, probing it the first time."""
        found = self._done.get(key)
        if found is not None:
            return found
        with self._lock:
            found = self._done.get(key)
            if found is None:
                found = self._done[key] = self._declare(key, rope_module)
        return found

    def _declare(self, key: BackendKey, rope_module: Any) -> Declared:
        preset = self._preset(key)
        if not self.enabled:
            return Declared(None, None, False, f"probe off: preset {preset!r}")
        start = time.monotonic()
        try:
            result = self._prober(key, rope_module)
        except Exception as e:  # noqa: BLE001 - any failure falls back to the preset
            self.seconds += time.monotonic() - start
            line = (f"engine probe failed for {key.label()} ({type(e).__name__}: {e}); "
                    f"declaring the preset {preset!r}")
            log.warning("attnaudit plugin: %s", line)
            return Declared(None, None, False, line)
        self.seconds += time.monotonic() - start
        log.info("attnaudit plugin: engine precision measured for %s in %.1f s: %s",
                 key.label(), time.monotonic() - start, result.evidence)
        return Declared(dict(result.precision), result.cast_point, True, result.evidence)
