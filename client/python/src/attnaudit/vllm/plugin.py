"""VllmAuditPlugin: what the vLLM seams call, free of vLLM itself.

The seams (seams.py) call three methods on the engine's thread:

  state(ctx, ...)      once per forward pass (later calls return the same
                       StepState): numbers the engine step, decides whether
                       it is sampled and, if so, which rows and layers;
  on_rotary(st, ...)   before a layer's RoPE: on sampled steps, copies the
                       decode rows of the pre-RoPE q and k (rolling check);
  on_attention(st, call)  after a layer's attention kernel: on sampled
                       steps and chosen layers, offers a snapshot builder to
                       the RolloutAuditor, which copies what it needs and
                       sends it from a background thread.

Precision: the backend's arithmetic is measured once per process by the
engine probe (attnaudit.vllm.precision, at the first attention call) and
declared on every snapshot (source "measured", its evidence line); the
preset when the probe cannot run (one log line says why).

An unsampled step costs one attribute lookup per seam call. Nothing here
blocks on the server: the auditor holds at most max_in_flight snapshots
and drops (and counts) the rest.

Step summaries: when every audit of a sampled step has an outcome, a
StepSummary goes to the callbacks (add_step_callback, settings.on_step)
on the plugin's own thread, and is logged when settings.log_summary.

Thread safety: state/on_rotary/on_attention are called from the engine's
thread; the rest is thread-safe. Errors: a failure in the plugin's own code
is counted (counters()["plugin_errors"]) and logged once, never raised into
the engine.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
import queue
import re
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

from .._enums import Verdict
from ..auditor import AuditResult, RolloutAuditor
from . import capture
from .expected import Expected
from .precision import BackendKey, Declared, PrecisionCache, Prober
from .prefix_versions import PrefixVersions
from .settings import Settings

log = logging.getLogger("attnaudit.vllm")


@dataclasses.dataclass(frozen=True)
class StepSummary:
    """The audits of one sampled engine step.

    layers: the layers audited; passed / drifted / failed / invalid:
    outcomes; dropped: audits skipped because every in-flight slot was busy;
    worst_layer / worst_share: the layer whose output drift used the largest
    share of its tolerance (1.0 = at the limit), over every comparison;
    top_diagnosis: the first diagnosis of the worst drifting layer (e.g.
    "stale-page"), with its one-line summary; request_ids: the requests
    audited; results: each AuditResult (reports included); rl_step: the
    training loop's step when it set one (set_rl_step, step_file);
    config_findings: how the audited layers differ from the model's
    configuration (expected.py), one phrase each; stale_prefix: audited
    requests that read prefix blocks cached under older weights
    (prefix_versions.py), one phrase each."""

    step: int
    layers: tuple
    passed: int
    drifted: int
    failed: int
    invalid: int
    dropped: int
    worst_layer: Optional[int]
    worst_share: Optional[float]
    top_diagnosis: Optional[str]
    diagnosis_summary: str
    request_ids: tuple
    results: tuple = ()
    inconclusive: int = 0
    rl_step: Optional[int] = None
    config_findings: tuple = ()
    stale_prefix: tuple = ()

    def as_dict(self, prefix: str = "attnaudit/") -> Dict[str, Any]:
        """Flat numbers for a metrics logger (wandb.log, a TensorBoard
        writer): counts, worst layer and share; the diagnosis as text."""
        out: Dict[str, Any] = {
            f"{prefix}passed": self.passed, f"{prefix}drifted": self.drifted,
            f"{prefix}failed": self.failed, f"{prefix}dropped": self.dropped,
            f"{prefix}inconclusive": self.inconclusive,
        }
        if self.worst_layer is not None:
            out[f"{prefix}worst_layer"] = self.worst_layer
        if self.worst_share is not None:
            out[f"{prefix}worst_share"] = self.worst_share
        if self.top_diagnosis:
            out[f"{prefix}top_diagnosis"] = self.top_diagnosis
        if self.rl_step is not None:
            out[f"{prefix}rl_step"] = self.rl_step
        out[f"{prefix}config_findings"] = len(self.config_findings)
        out[f"{prefix}stale_prefix"] = len(self.stale_prefix)
        return out

    def line(self) -> str:
        rl = "" if self.rl_step is None else f" (RL step {self.rl_step})"
        text = (f"attnaudit step {self.step}{rl}: layers {list(self.layers)} "
                f"PASS {self.passed} DRIFT {self.drifted}")
        if self.inconclusive:
            text += f" INCONCLUSIVE {self.inconclusive}"
        if self.failed or self.invalid or self.dropped:
            text += (f" failed {self.failed} invalid {self.invalid} "
                     f"dropped {self.dropped}")
        if self.worst_layer is not None:
            text += f"; worst layer {self.worst_layer} ({self.worst_share:.3g} of tolerance)"
        if self.top_diagnosis:
            text += f"; diagnosis {self.top_diagnosis}: {self.diagnosis_summary}"
        if self.config_findings:
            text += "; unlike the model's configuration: " + "; ".join(self.config_findings)
        if self.stale_prefix:
            text += "; prefix cached under older weights: " + "; ".join(self.stale_prefix)
        return text


@dataclasses.dataclass
class StepState:
    """One forward pass, as the plugin sees it."""

    step: int
    sampled: bool = False
    layers: frozenset = frozenset()
    rows: List[int] = dataclasses.field(default_factory=list)
    tokens: List[int] = dataclasses.field(default_factory=list)
    request_ids: Optional[List[str]] = None
    pending: Optional[capture.PreRope] = None
    rotary: Optional[Dict[str, Any]] = None  # theta, rotary_dim, neox
    inv_freq: Optional[Any] = None  # the rotary module's, when vLLM's
    rl_step: Optional[int] = None  # the training loop's, when it set one
    run: Optional[str] = None
    weight_version: Any = None  # the weights in use, when the loop named them


@dataclasses.dataclass
class _Tally:
    layers: List[int] = dataclasses.field(default_factory=list)
    offered: int = 0
    dropped: int = 0
    results: List[AuditResult] = dataclasses.field(default_factory=list)
    closed: bool = False
    request_ids: tuple = ()
    rl_step: Optional[int] = None
    findings: List[str] = dataclasses.field(default_factory=list)
    stale: List[str] = dataclasses.field(default_factory=list)


_NOT_A_STEP = StepState(step=-1)
_ATTR = "_attnaudit_step_state"


class VllmAuditPlugin:
    """See the module docstring. client_factory: builds the AuditClient on
    first use (in the process that runs attention, never before a fork);
    prober: runs the engine probe for a backend (attnaudit.vllm.precision;
    tests pass numpy engines)."""

    def __init__(self, settings: Settings,
                 client_factory: Optional[Callable[[], Any]] = None,
                 prober: Optional[Prober] = None):
        self.settings = settings
        self.precision = PrecisionCache(
            settings.probe, prober,
            preset=lambda key: settings.engine or capture.BACKENDS.get(key.backend, ("", ""))[1])
        # The model's rotary module (the first the seams see): the probe
        # rotates with it, as the model does.
        self.rope_module: Any = None
        self.needs_probe = settings.probe
        self._client_factory = client_factory or self._default_client
        self._auditor: Optional[RolloutAuditor] = None
        self._next_step = 0
        self._universe: Optional[List[int]] = None
        self._lock = threading.Lock()
        self._tallies: Dict[int, _Tally] = {}
        self._callbacks: List[Callable[[StepSummary], None]] = [
            _resolve(spec) for spec in settings.on_step]
        self._summaries: "queue.Queue[Optional[StepSummary]]" = queue.Queue(maxsize=256)
        self._summary_thread: Optional[threading.Thread] = None
        self._counts = {"steps": 0, "sampled_steps": 0, "plugin_errors": 0,
                        "summaries_dropped": 0, "rope_missed": 0, "too_large": 0,
                        "decode_rows_seen": 0, "decode_rows_chosen": 0,
                        "config_mismatch": 0, "config_mismatch_layers": 0,
                        "stale_prefix_rows": 0}
        self._warned: set = set()
        self.model: Optional[str] = settings.model
        self.rope_parameters: Optional[Dict[str, Any]] = None
        # What the model's configuration fixes about attention (None:
        # not known yet); a layer built otherwise is a finding.
        self.expected: Optional[Expected] = None
        # The layers (id of vLLM's module) compared with it at first sight.
        self.layers_checked: set = set()
        # The training loop's step and run (set_rl_step, settings.step_file).
        self.rl_step: Optional[int] = None
        self.rl_run: Optional[str] = None
        self._step_file_mtime: Optional[int] = None
        # The weight version each cache block was written under.
        self.prefix = PrefixVersions()
        self.wrapped: List[str] = []  # the seams installed (register())
        self.announced = False
        self._closed = False
        # id(rotary module) -> its inverse frequencies (or None): computed
        # once per module (a model may hold several: local and global RoPE).
        self._inv_freqs: Dict[int, Optional[Any]] = {}

    # ------------------------------------------------------------------
    # Engine-thread hooks
    # ------------------------------------------------------------------

    def state(self, ctx: Any, metadata: Callable[[], Any],
              layer_names: Callable[[], Sequence[str]],
              request_ids: Callable[[], Optional[Sequence[str]]]) -> Optional[StepState]:
        """The StepState of the forward pass `ctx` (an object the plugin may
        set an attribute on), or None outside engine steps (warm-up,
        profiling: no attention metadata)."""
        st = getattr(ctx, _ATTR, None)
        if st is not None:
            return None if st is _NOT_A_STEP else st
        md = metadata()
        if md is None:
            setattr(ctx, _ATTR, _NOT_A_STEP)
            return None
        st = StepState(step=self._next_step)
        self._next_step += 1
        self._counts["steps"] += 1
        setattr(ctx, _ATTR, st)
        self._close_earlier_steps(st.step)
        if self.settings.step_file:
            self._read_step_file()
        if self.prefix.active:
            self.prefix.stamp(md.slot_mapping, getattr(md, "num_actual_tokens", None))
        s = self.settings
        if capture.step_chosen(st.step, s.sample_every, s.sample_rate, s.seed):
            self._choose(st, md, layer_names, request_ids)
        return st

    def on_rotary(self, st: Optional[StepState], rotary: Dict[str, Any],
                  query: Any, key: Any, module: Any = None) -> None:
        """Before RoPE runs (it may rotate in place): keeps copies of the
        sampled decode rows of q [T, ...] and k [T, ...], and the module's
        inverse frequencies (the snapshot's RoPE table)."""
        if st is None or not st.sampled:
            return
        st.rotary = rotary
        if module is not None:
            if id(module) not in self._inv_freqs:
                self._inv_freqs[id(module)] = capture.engine_inv_freq(
                    module, int(rotary["rotary_dim"]))
            st.inv_freq = self._inv_freqs[id(module)]
        if self.settings.rope_check and key is not None:
            toks = list(st.tokens)
            st.pending = capture.PreRope(tuple(toks), query[toks], key[toks])

    def on_attention(self, st: Optional[StepState], call: capture.AttentionCall) -> None:
        """After the kernel wrote call.output: offers the snapshot."""
        if st is None or not st.sampled:
            return
        pre, st.pending = st.pending, None
        if call.layer not in st.layers:
            return
        findings = self.check_config(call)
        stale = self._stale_prefix(call, st)
        budget = self.settings.max_snapshot_mb * 2.0**20
        keep = capture.rows_within(call, range(len(st.rows)), st.rows, budget)
        if not keep:
            self._counts["too_large"] += 1
            return
        rows = [st.rows[k] for k in keep]
        tokens = [st.tokens[k] for k in keep]
        ids = None if st.request_ids is None else [st.request_ids[k] for k in keep]
        if self.settings.rope_check and pre is None and (
                st.rotary is not None or self.rope_parameters is not None):
            self._rope_missed()
        rope = None
        if st.rotary is not None and _length_scaled(self.rope_parameters):
            self._warn_once("length-scaled rope",
                            "attnaudit plugin: RoPE scaled by sequence length (%s) is "
                            "not declared by the plugin: these audits check attention "
                            "without RoPE", _rope_type(self.rope_parameters))
        elif st.rotary is not None and not _nested(self.rope_parameters):
            rope = capture.rope_declaration(rope_parameters=self.rope_parameters,
                                            **st.rotary)
        labels = capture.snapshot_labels(
            model=self.model, backend=_backend_label(call), layer=call.layer,
            step=st.step if st.rl_step is None else st.rl_step,
            run=st.run or self.settings.run, request_ids=ids,
            weight_version=st.weight_version)

        declared = self.declared(capture.backend_key(call))

        def build():
            snapshot = capture.build_snapshot(
                call, rows=rows, tokens=tokens, engine=self.settings.engine,
                rope=rope, pre_rope=pre, labels=labels, precision=declared.precision,
                cast_point=declared.cast_point, inv_freq=st.inv_freq)
            if self.settings.save_dir:
                self._save(snapshot, st.step, call.layer)
            return snapshot

        auditor = self.auditor()
        dropped_before = auditor.counters.dropped
        with self._lock:
            tally = self._tallies.setdefault(
                st.step, _Tally(request_ids=tuple(ids or ()), rl_step=st.rl_step))
            tally.offered += 1
            tally.layers.append(call.layer)
            tally.findings.extend(f"layer {call.layer} {x}" for x in findings)
            tally.stale.extend(stale)
        auditor.step(build, layer=call.layer, step=st.step)
        if auditor.counters.dropped != dropped_before:
            with self._lock:
                tally.dropped += 1
            self._maybe_summarise(st.step)

    def declared(self, key: BackendKey) -> Declared:
        """The precision declared for a backend: probed once per process
        (the first call pays a few seconds; later ones a dict lookup)."""
        return self.precision.get(key, self.rope_module)

    def warm_up(self, key: BackendKey) -> None:
        """The seams' first attention call: probe its backend now, at
        start-up, not on the first sampled step."""
        self.needs_probe = False
        self.declared(key)

    # ------------------------------------------------------------------
    # Results
    # ------------------------------------------------------------------

    def auditor(self) -> RolloutAuditor:
        if self._auditor is None:
            s = self.settings
            self._auditor = RolloutAuditor(
                self._client_factory(), sample_every=1, max_in_flight=s.max_in_flight,
                mode=s.mode, priority=s.priority, timeout=s.timeout, run=s.run,
                on_result=self._on_result)
        return self._auditor

    def add_step_callback(self, fn: Callable[[StepSummary], None]) -> None:
        self._callbacks.append(fn)

    def counters(self) -> Dict[str, int]:
        """The plugin's counters and its auditor's (steps here are engine
        steps; the auditor's steps are offered layer snapshots)."""
        out = dict(self._counts)
        if self._auditor is not None:
            for k, v in dataclasses.asdict(self._auditor.counters).items():
                out[f"audits_{k}"] = v
        return out

    def flush(self, timeout: Optional[float] = None) -> bool:
        """Closes the current step, waits for every audit in flight and for
        the summaries to be delivered."""
        self._close_earlier_steps(self._next_step)
        ok = True if self._auditor is None else self._auditor.flush(timeout)
        with self._lock:
            steps = list(self._tallies)
        for step in steps:
            self._maybe_summarise(step)
        if self._summary_thread is not None:
            self._summaries.join()
        return ok

    def announce(self, backend: str) -> None:
        """The start-up line, once, from the process whose attention is
        audited (the seams' first attention call): vLLM loads plugins in
        processes that run no model too, and they stay quiet."""
        self.announced = True
        s = self.settings
        log.info("attnaudit plugin active in process %d (%s): server %s, %s, layers %s%s, "
                 "at most %d rows a step; wrapped: %s", os.getpid(), backend, s.server,
                 f"sample rate {s.sample_rate}" if s.sample_rate is not None
                 else f"every {s.sample_every} steps",
                 "all" if s.layers is None else list(s.layers),
                 " (one per sampled step)" if s.rotate_layers else "", s.max_rows,
                 ", ".join(self.wrapped) or "nothing")

    def close_at_exit(self, limit: float = 10.0, stall: float = 2.0) -> bool:
        """At interpreter exit: waits for the audits in flight while they
        keep finishing (each round of `stall` seconds sees one finish;
        `limit` in all), then closes. A server that stopped answering holds
        the engine's exit for `stall` seconds, not for a call's deadline;
        the audits left unfinished are said (submitted jobs stay on the
        server)."""
        self._close_earlier_steps(self._next_step)
        aud = self._auditor
        left = 0 if aud is None else aud.outstanding
        deadline = time.monotonic() + limit
        while left and time.monotonic() < deadline:
            aud.flush(min(stall, max(0.0, deadline - time.monotonic())))
            now = aud.outstanding
            if now == left:
                break
            left = now
        if left:
            log.warning("attnaudit plugin: exiting with %d audit(s) unfinished: none "
                        "finished within %.3g s", left, stall)
        return self.close(0.0) and not left

    def close(self, timeout: Optional[float] = 30.0) -> bool:
        """Flushes and stops, within `timeout` seconds overall."""
        end = None if timeout is None else time.monotonic() + timeout
        ok = self.flush(timeout)
        # Outcomes that arrive later (a send that ends on its deadline) are
        # counted, not summarised: the summaries stop here.
        self._closed = True
        self._warn_if_nothing_sampled()
        if self._auditor is not None:
            left = None if end is None else max(0.0, end - time.monotonic())
            ok = self._auditor.close(left) and ok
        if self._summary_thread is not None:
            self._summaries.put(None)
            self._summary_thread.join(timeout=5)
            self._summary_thread = None
        return ok

    def check_config(self, call: capture.AttentionCall, audited: bool = True) -> List[str]:
        """How call's layer differs from the model's configuration
        (expected.py): the snapshot declares what the kernel was given, so
        a layer built wrong passes its audits; the configuration does not.
        Counted per audit (config_mismatch) and per layer at first sight
        (config_mismatch_layers, via the seams), and said once per layer
        and quantity."""
        if self.expected is None:
            return []
        q = call.query
        found = self.expected.mismatches(
            call.layer, scale=float(call.scale), soft_cap=call.logits_soft_cap,
            window=call.sliding_window, has_sinks=call.sinks is not None,
            head_dim=int(q.shape[-1]), num_heads=int(q.shape[-2]) if len(q.shape) > 2 else 0)
        if found:
            self._counts["config_mismatch" if audited else "config_mismatch_layers"] += 1
        for phrase in found:
            self._warn_once(f"config {call.layer} {phrase.split(' ')[0]}",
                            "attnaudit plugin: layer %d runs attention with %s: a "
                            "difference the audits, which declare what the kernel was "
                            "given, cannot see", call.layer, phrase)
        return found

    def _save(self, snapshot: Any, step: int, layer: int) -> None:
        name = f"{self.settings.run or 'vllm'}-step{step}-layer{layer}.pb"
        try:
            os.makedirs(self.settings.save_dir, exist_ok=True)
            snapshot.save(os.path.join(self.settings.save_dir, name))
        except OSError as e:
            self.error("save_dir", e)

    def set_rl_step(self, step: Optional[int], run: Optional[str] = None,
                    weight_version: Any = None) -> None:
        """The training loop's step (and run) for the snapshots of later
        engine steps: their step label, in place of the engine's counter.
        weight_version (default: the step) names the weights in use: the
        weight_version label of later snapshots, and a prefix block cached
        under an older one and read later is stale."""
        self.rl_step = None if step is None else int(step)
        if run is not None:
            self.rl_run = str(run)
        version = self.rl_step if weight_version is None else weight_version
        if version is not None:
            self.prefix.set_version(version)

    def learn_cache(self, kv_cache: Any, backend: str) -> None:
        """The cache's geometry, from the first real layer cache seen."""
        self.prefix.learn_cache(kv_cache, backend)

    def _stale_prefix(self, call: capture.AttentionCall, st: StepState) -> List[str]:
        """The chosen rows that read prefix blocks written under older
        weights: counted, said once, named in the step's summary."""
        out: List[str] = []
        if not self.prefix.active or self.prefix.index < 2:
            return out
        for k, row in enumerate(st.rows):
            n = self.prefix.stale(call.block_table[row], int(call.seq_lens[row]))
            if not n:
                continue
            rid = st.request_ids[k] if st.request_ids else f"row {row}"
            out.append(f"{rid}: {n} block(s) cached before weight version "
                       f"{self.prefix.version}")
        if out:
            self._counts["stale_prefix_rows"] += len(out)
            self._warn_once("stale prefix", "attnaudit plugin: %s: a prefix cache not "
                            "reset after the weights changed (e.g. vLLM's "
                            "reset_prefix_cache after a weight sync)", out[0])
        return out

    def _warn_if_nothing_sampled(self) -> None:
        """A run shorter than sample_every audits nothing: say so rather
        than end as if every step had passed."""
        c = self._counts
        if c["steps"] > 0 and c["sampled_steps"] == 0:
            s = self.settings
            how = (f"sample_rate={s.sample_rate}" if s.sample_rate is not None
                   else f"sample_every={s.sample_every}")
            log.warning("attnaudit plugin: %d engine steps, none sampled (%s): nothing "
                        "was audited; lower it for short runs", c["steps"], how)

    def _warn_once(self, key: str, message: str, *args: Any) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(message, *args)

    def _rope_missed(self) -> None:
        """A snapshot of a RoPE model sent without its pre-RoPE rows: the
        rotary op ran where the seam cannot see it (a compiled graph, when
        enforce_eager is off). Counted, and said once, loudly."""
        self._counts["rope_missed"] += 1
        self._warn_once("rope_missed",
                        "attnaudit plugin: RoPE unchecked: the rotary op runs inside a "
                        "compiled graph, so no pre-RoPE q/k reach the audits "
                        "(enforce_eager=True checks it); counted as rope_missed")

    def error(self, where: str, e: BaseException) -> None:
        """A failure in the plugin's code: counted, logged once per kind."""
        self._counts["plugin_errors"] += 1
        key = (where, type(e).__name__)
        if key not in self._warned:
            self._warned.add(key)
            log.warning("attnaudit plugin: %s failed (%s: %s); the engine is "
                        "unaffected, later failures are only counted",
                        where, type(e).__name__, e)

    # ------------------------------------------------------------------

    def _choose(self, st: StepState, md: Any, layer_names, request_ids) -> None:
        s = self.settings
        num_reqs = int(len(md.seq_lens))
        rows, tokens = capture.decode_rows(md.query_start_loc, num_reqs)
        ids = request_ids() if rows else None
        keep = capture.choose_rows(rows, ids, pattern=s.request_filter,
                                   fraction=s.request_fraction, seed=s.seed,
                                   max_rows=s.max_rows,
                                   offset=self._counts["sampled_steps"] * s.max_rows)
        self._counts["decode_rows_seen"] += len(rows)
        if not keep:
            return
        layers = self._layers(layer_names)
        if not layers:
            return
        if s.rotate_layers:
            k = st.step // s.sample_every if s.sample_rate is None else st.step
            layers = [layers[k % len(layers)]]
        st.sampled = True
        st.layers = frozenset(layers)
        st.rl_step, st.run = self.rl_step, self.rl_run
        st.weight_version = self.prefix.version
        st.rows = [rows[k] for k in keep]
        st.tokens = [tokens[k] for k in keep]
        if ids is not None:
            st.request_ids = [str(ids[r]) if r < len(ids) else "" for r in st.rows]
        self._counts["sampled_steps"] += 1
        self._counts["decode_rows_chosen"] += len(keep)

    def _read_step_file(self) -> None:
        """settings.step_file: the training loop writes its step ("17",
        "17 run-name" or "17 run-name weight-version") there; read at each
        engine step when it changed (a stat), for loops that cannot call
        set_rl_step in the engine's process."""
        path = self.settings.step_file
        if not path:
            return
        try:
            mtime = os.stat(path).st_mtime_ns
            if mtime == self._step_file_mtime:
                return
            with open(path, encoding="utf-8") as f:
                words = f.read().split()
            self._step_file_mtime = mtime
            if words:
                self.set_rl_step(int(words[0]), words[1] if len(words) > 1 else None,
                                 words[2] if len(words) > 2 else None)
        except FileNotFoundError:
            return  # not written yet
        except (OSError, ValueError) as e:
            self._warn_once("step_file", "attnaudit plugin: step_file %s: %s; the "
                            "snapshots keep the last step read", path, e)

    def _layers(self, layer_names) -> List[int]:
        if self.settings.layers is not None:
            return list(self.settings.layers)
        if self._universe is None:
            found = set()
            for name in layer_names():
                index = layer_index(name)
                if index is not None:
                    found.add(index)
            self._universe = sorted(found)
        return self._universe

    def _on_result(self, result: AuditResult) -> None:
        with self._lock:
            tally = self._tallies.get(result.step)
            if tally is None:
                return
            tally.results.append(result)
        self._maybe_summarise(result.step)

    def _close_earlier_steps(self, step: int) -> None:
        with self._lock:
            earlier = [s for s, t in self._tallies.items() if s < step and not t.closed]
            for s in earlier:
                self._tallies[s].closed = True
        for s in earlier:
            self._maybe_summarise(s)

    def _maybe_summarise(self, step: int) -> None:
        with self._lock:
            tally = self._tallies.get(step)
            if (tally is None or not tally.closed
                    or len(tally.results) + tally.dropped < tally.offered):
                return
            del self._tallies[step]
        self._emit(summarise(step, tally.layers, tally.results, tally.dropped,
                             tally.request_ids, rl_step=tally.rl_step,
                             config_findings=tally.findings, stale_prefix=tally.stale))

    def _emit(self, summary: StepSummary) -> None:
        if self._closed:
            return
        failed = any(r.error is not None for r in summary.results)
        if not self._callbacks and not self.settings.log_summary and not failed:
            return
        if self._summary_thread is None:
            self._summary_thread = threading.Thread(
                target=self._deliver, name="attnaudit-vllm-summaries", daemon=True)
            self._summary_thread.start()
        try:
            self._summaries.put_nowait(summary)
        except queue.Full:
            self._counts["summaries_dropped"] += 1

    def _deliver(self) -> None:
        while True:
            summary = self._summaries.get()
            try:
                if summary is None:
                    return
                if self.settings.log_summary:
                    (log.warning if summary.drifted else log.info)(summary.line())
                self._warn_failures(summary)
                for fn in list(self._callbacks):
                    try:
                        fn(summary)
                    except Exception as e:  # noqa: BLE001 - a user callback
                        self.error("on_step callback", e)
            finally:
                self._summaries.task_done()

    def _warn_failures(self, summary: StepSummary) -> None:
        """A failed audit's reason (a server down, a refused snapshot) is
        logged once per kind, whatever log_summary says: the step line
        alone only counts it."""
        for r in summary.results:
            if r.error is None:
                continue
            key = ("audit", type(r.error).__name__, str(r.error)[:60])
            if key not in self._warned:
                self._warned.add(key)
                log.warning("attnaudit plugin: an audit of step %d layer %s failed "
                            "(%s: %s); later failures of this kind are only counted",
                            summary.step, r.layer, type(r.error).__name__, r.error)

    def _default_client(self):
        from ..client import AuditClient
        s = self.settings
        tls = None
        if s.tls_ca == "system":
            tls = True
        elif s.tls_ca:
            tls = {"ca": s.tls_ca}
        return AuditClient(s.server, tls=tls, token=s.token, timeout=s.timeout)


def summarise(step: int, layers: Sequence[int], results: Sequence[AuditResult],
              dropped: int, request_ids: Sequence[str], *, rl_step: Optional[int] = None,
              config_findings: Sequence[str] = (),
              stale_prefix: Sequence[str] = ()) -> StepSummary:
    """A StepSummary from a step's audit outcomes."""
    counts = {Verdict.PASS: 0, Verdict.DRIFT: 0, Verdict.INVALID: 0,
              Verdict.INCONCLUSIVE: 0}
    failed = 0
    worst = None  # (share, layer, result)
    for r in results:
        if r.verdict in counts:
            counts[r.verdict] += 1
        else:
            failed += 1
        if r.report is None:
            continue
        share = drift_share(r.report)
        drifting = r.verdict == Verdict.DRIFT
        key = (drifting, share if share is not None else -1.0)
        if worst is None or key > worst[0]:
            worst = (key, r)
    worst_layer = worst_share = None
    diagnosis, diagnosis_summary = None, ""
    if worst is not None:
        r = worst[1]
        worst_layer, worst_share = r.layer, worst[0][1] if worst[0][1] >= 0 else None
        top = r.report.diagnosis if r.verdict == Verdict.DRIFT else None
        if top is not None:
            diagnosis, diagnosis_summary = top.hypothesis, top.summary
    return StepSummary(step=step, layers=tuple(layers), passed=counts[Verdict.PASS],
                       drifted=counts[Verdict.DRIFT], failed=failed,
                       invalid=counts[Verdict.INVALID], dropped=dropped,
                       worst_layer=worst_layer, worst_share=worst_share,
                       top_diagnosis=diagnosis, diagnosis_summary=diagnosis_summary,
                       request_ids=tuple(request_ids), results=tuple(results),
                       inconclusive=counts[Verdict.INCONCLUSIVE], rl_step=rl_step,
                       config_findings=tuple(dict.fromkeys(config_findings)),
                       stale_prefix=tuple(dict.fromkeys(stale_prefix)))


def drift_share(report) -> Optional[float]:
    """The largest output drift of a report as a share of its tolerance."""
    best = None
    for c in report.comparisons:
        out = c.out
        if out is None or out.tolerance <= 0:
            continue
        share = out.max_abs / out.tolerance
        best = share if best is None else max(best, share)
    return best


_LAYER_INDEX = re.compile(r"(?:^|\.)(\d+)(?:\.|$)")


def layer_index(name: str) -> Optional[int]:
    """The layer index in a vLLM module name ("model.layers.12.self_attn.attn"
    -> 12): its first integer component."""
    m = _LAYER_INDEX.search(name)
    return int(m.group(1)) if m else None


def _backend_label(call: capture.AttentionCall) -> str:
    return f"{call.backend}/{call.isa}" if call.isa else call.backend


def _rope_type(params: Optional[Dict[str, Any]]) -> Optional[str]:
    params = params or {}
    return params.get("rope_type", params.get("type"))


def _length_scaled(params: Optional[Dict[str, Any]]) -> bool:
    """Dynamic NTK and LongRoPE: what they rotate with depends on the
    sequence length vLLM fixed at start-up, which the plugin does not
    read; declaring them without it fails the snapshot, declaring plain
    RoPE would call a correct engine wrong."""
    return _rope_type(params) in ("dynamic", "longrope", "su")


def _nested(params: Optional[Dict[str, Any]]) -> bool:
    """Per-layer-type RoPE parameters (e.g. Gemma 3's full/sliding): which
    one a layer uses is not known here, so no RoPE is declared."""
    return bool(params) and any(isinstance(v, dict) for v in params.values())


def _resolve(spec: str) -> Callable[[StepSummary], None]:
    module, _, attr = spec.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"on_step: {spec} is not callable")
    return obj
