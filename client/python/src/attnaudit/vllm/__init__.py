"""Audit a running vLLM without changing its code.

`pip install attnaudit` registers this plugin under vLLM's
`vllm.general_plugins` entry point group; vLLM calls register() in each of
its processes at start-up. The plugin stays inactive (and imports nothing
of vLLM) unless a server is configured:

    export ATTNAUDIT_VLLM_SERVER=attnaudit:50051
    export ATTNAUDIT_VLLM_SAMPLE_EVERY=200      # every 200th engine step
    export ATTNAUDIT_VLLM_RUN=grpo-run-17       # label for list_results

Every setting is listed in attnaudit.vllm.settings; docs/PYTHON.md,
"Auditing vLLM without code changes", says what each costs.

Active, it wraps vLLM's attention backend, rotary embedding and model
runner (seams.py); at start-up it measures the backend's arithmetic once
(attnaudit.probe: a few seconds) and declares it on every snapshot; on
sampled steps it builds snapshots from the very
tensors the kernel read (query, paged cache, block table, sequence lengths,
output; pre-RoPE q and k for the rolling RoPE check) and hands them to a
non-blocking RolloutAuditor. Each audited step yields a StepSummary:
logged, and passed to callbacks (add_step_callback in the engine's
process, or ATTNAUDIT_VLLM_ON_STEP=pkg.module:function in every process).
The server exports the verdicts per layer to Prometheus.
"""

from __future__ import annotations

import atexit
import logging
import os
from typing import Callable, Optional

from .plugin import StepSummary, VllmAuditPlugin, summarise
from .settings import Settings, SettingsError, load

__all__ = ["StepSummary", "Settings", "SettingsError", "VllmAuditPlugin",
           "add_step_callback", "flush", "plugin", "register", "set_rl_step",
           "summarise"]

log = logging.getLogger("attnaudit.vllm")
_ACTIVE: Optional[VllmAuditPlugin] = None


def register() -> None:
    """vLLM's entry point. Reads the settings; when a server is configured,
    installs the seams (once per process). A setting that does not parse
    raises SettingsError, which stops vLLM's start-up with its message:
    an audit the user asked for is never silently off."""
    global _ACTIVE
    settings = load()
    if not settings.active or _ACTIVE is not None:
        return
    _ensure_log_handler()
    active = VllmAuditPlugin(settings)
    from . import seams
    active.wrapped = seams.install(active)
    _ACTIVE = active
    atexit.register(active.close_at_exit)
    # vLLM loads its plugins in every process it starts (the front end, a
    # model-registry subprocess, the engine core); the plugin says it is
    # active once, in the process whose attention it audits (announce()).
    log.debug("attnaudit plugin configured in process %d; wrapped: %s",
              os.getpid(), ", ".join(active.wrapped) or "nothing")


def plugin() -> Optional[VllmAuditPlugin]:
    """The active plugin of this process, or None."""
    return _ACTIVE


def add_step_callback(fn: Callable[[StepSummary], None]) -> bool:
    """Adds a StepSummary callback in this process; False when the plugin
    is not active here (e.g. the engine runs in another process: use
    ATTNAUDIT_VLLM_ON_STEP there)."""
    if _ACTIVE is None:
        return False
    _ACTIVE.add_step_callback(fn)
    return True


def set_rl_step(step: Optional[int], run: Optional[str] = None,
                weight_version: Optional[object] = None) -> bool:
    """Labels the snapshots of later engine steps with the training loop's
    step (and run), in place of the engine's step counter; weight_version
    (default: the step) names the weights in use: the snapshots' weight
    version label (a train-rollout pair whose trainer names another says
    so), and prefix blocks cached under older ones are named when read.
    False when the
    plugin is not active in this process: with vLLM's engine core in its
    own process (the default), call it there through the method the
    plugin adds to vLLM's workers,
    `llm.collective_rpc("attnaudit_set_rl_step", args=(step,))`, or set
    ATTNAUDIT_VLLM_STEP_FILE."""
    if _ACTIVE is None:
        return False
    _ACTIVE.set_rl_step(step, run, weight_version)
    return True


def flush(timeout: Optional[float] = None) -> bool:
    """Waits for the audits in flight and their summaries (True when
    nothing is left, or the plugin is inactive)."""
    return True if _ACTIVE is None else _ACTIVE.flush(timeout)


def _ensure_log_handler() -> None:
    # vLLM configures its own "vllm" logger only; without a handler here
    # the step summaries would vanish below WARNING.
    if not log.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
