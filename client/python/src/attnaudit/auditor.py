"""RolloutAuditor: a sampling hook that audits a rollout without slowing it.

    auditor = attnaudit.RolloutAuditor(client, sample_every=100,
                                       layers=[0, 15, 31], max_in_flight=2)
    for step in decode_loop:
        for layer in layers:
            ...attention...
            auditor.step(lambda: attnaudit.Snapshot.from_paged_kv(...),
                         layer=layer)
    print(auditor.counters, auditor.latest_verdicts)
    auditor.close()

Sampling. A call is sampled when its step is a multiple of `sample_every`
(after `offset`) and its layer is eligible: any layer when `layers` is None,
else the listed ones -- all of them at every sampled step, or, with
rotate_layers=True, one per sampled step in turn: step s takes
layers[((s - offset) // sample_every) % len(layers)], a function of the step
alone, so every rank of a tensor-parallel group picks the same layer. The step is the `step=`
argument, or else the number of earlier calls with the same layer. The
snapshot argument may be a built Snapshot or a callable returning one (a
builder); a builder is called only when the call is sampled, so an
unsampled step costs a counter update and a modulo (about a microsecond).

Never blocking. At most `max_in_flight` snapshots are held at once (built
and waiting, or being sent). When all slots are busy -- the server is slow,
paused or down -- a sampled step is dropped and counted *before* its builder
runs, and step() returns at once. A sampled step costs the builder's copy of
the needed bytes (host arrays: a gather in the caller's thread; CUDA
tensors: a gather on a side stream that the engine's stream waits for, and
an asynchronous copy to pinned memory that only the background thread waits
for) plus an enqueue. Sending happens on background threads.

Labels. A sampled snapshot without a layer or step label gets the call's;
one without a run label gets the step's `run=` or else the auditor's `run`
(the rollout or training run, which list_results filters on).

Modes. mode="audit" (default) sends each snapshot with the Audit call at
`priority` ("sampled" by default) and reads the report from the answer.
mode="submit" queues durable jobs with Submit (the slot is freed once the
server has the job on disk) and collects their reports by polling
GetResult, not through WatchResults: a watch's filter cannot name job ids,
so every auditor of a fleet would receive every result of its tenant, and
a job that finishes before the server registers the watch is missed. A job
the server answers NOT_FOUND within `not_found_grace` seconds of its
submission is polled again (behind a round-robin balanced fleet the replica
asked may not see it yet); after that NOT_FOUND is final and counted as
failed.

Results. `counters` (an AuditorCounters: steps, sampled, sent, dropped,
failed, invalid, passed, drifted), `latest` (the AuditResult of the newest
audited step per layer), `latest_verdicts`, `results()` (the last `keep`
results, in completion order) and the
optional `on_result` callback (called on a background thread; exceptions
in it are counted in `callback_errors`, never propagated).

Waiting. flush(timeout) and close(timeout) wait at most `timeout` seconds
in all, however many snapshots are in flight: each sampled snapshot has a
concurrent.futures.Future, done once its outcome is recorded and its slot
is free, and they wait on those futures against one deadline. close() then
stops the threads without waiting for them: they are daemon threads, and a
send still running (a server that stopped answering) ends on its own call
deadline, its outcome still counted. (A concurrent.futures.ThreadPoolExecutor's
threads are joined at interpreter exit, so such a send would hold the
process's exit for its whole deadline: hence threads of our own.)

Thread safety: step() is meant to be called from one thread (the rollout
loop; its counters are then exact); every other method is thread-safe.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import queue
import sys
import threading
import time
import warnings
from typing import Any, Callable, Dict, Iterable, List, Optional

from ._enums import Verdict
from .errors import AuditError, InvalidArgumentError
from .report import Report
from .snapshot import Snapshot


@dataclasses.dataclass(frozen=True)
class AuditorCounters:
    """steps: hook calls. sampled: calls the sampling chose. dropped: sampled
    calls skipped because every in-flight slot was busy (or the auditor was
    closed). sent: snapshots the server accepted. failed: sampled calls that
    ended in an error (builder exception, server unreachable or refusing,
    deadline). invalid: snapshots the server found invalid (a client-side
    bug). passed / drifted / inconclusive: reports by verdict.
    callback_errors: exceptions raised by on_result."""

    steps: int = 0
    sampled: int = 0
    dropped: int = 0
    sent: int = 0
    failed: int = 0
    invalid: int = 0
    passed: int = 0
    drifted: int = 0
    inconclusive: int = 0
    callback_errors: int = 0


@dataclasses.dataclass(frozen=True)
class AuditResult:
    """Outcome of one sampled snapshot: the report, or the error."""

    step: Optional[int]
    layer: Optional[int]
    verdict: Optional[Verdict]
    report: Optional[Report] = None
    error: Optional[BaseException] = None
    job_id: Optional[str] = None


@dataclasses.dataclass
class _Item:
    snapshot: Optional[Snapshot]
    step: Optional[int]
    layer: Optional[int]
    submitted_at: float = 0.0  # time.monotonic() when Submit returned
    # Done once the outcome is recorded and the slot released (flush()
    # waits for it). The flags below are read and written under _lock.
    done: Optional[concurrent.futures.Future] = None
    job_id: Optional[str] = None  # submit mode: the job the poller collects
    released: bool = False  # the sender released the item's slot
    recorded: bool = False  # the poller recorded the job's outcome


class RolloutAuditor:
    """The sampling hook (see the module docstring)."""

    def __init__(self, client: Any, *, sample_every: int = 100,
                 layers: Optional[Iterable[int]] = None, rotate_layers: bool = False,
                 offset: int = 0, max_in_flight: int = 2, mode: str = "audit",
                 priority: Any = "sampled", options: Any = None,
                 timeout: float = 120.0, keep: int = 64,
                 on_result: Optional[Callable[[AuditResult], None]] = None,
                 side_stream: bool = True, poll_interval: float = 0.5,
                 run: Optional[str] = None, not_found_grace: float = 5.0):
        if sample_every < 1:
            raise ValueError(f"sample_every: must be >= 1, got {sample_every}")
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight: must be >= 1, got {max_in_flight}")
        if mode not in ("audit", "submit"):
            raise ValueError(f"mode: {mode!r}; expected 'audit' or 'submit'")
        self._client = client
        self.sample_every = int(sample_every)
        self.offset = int(offset)
        self._layers = None if layers is None else [int(x) for x in layers]
        self._layer_set = None if self._layers is None else frozenset(self._layers)
        if rotate_layers and not self._layers:
            raise ValueError("rotate_layers: needs a non-empty layers list")
        self._rotate = bool(rotate_layers)
        self._mode = mode
        self._priority = priority
        self._options = options
        self._timeout = timeout
        self._on_result = on_result
        self._side_stream = side_stream
        self._poll_interval = poll_interval
        self.run = None if run is None else str(run)
        self._not_found_grace = float(not_found_grace)
        self.max_in_flight = int(max_in_flight)

        # Caller-thread state (no lock: step() has one caller).
        self._steps = 0
        self._sampled = 0
        self._dropped = 0
        self._auto_step: Dict[Optional[int], int] = {}
        self._streams: Dict[Any, Any] = {}
        # Background state, under _lock.
        self._lock = threading.Lock()
        self._outstanding: set = set()  # the Futures of unfinished items
        self._counts: collections.Counter[str] = collections.Counter()
        self._latest: Dict[Optional[int], AuditResult] = {}
        self._recent: collections.deque[AuditResult] = collections.deque(maxlen=max(1, keep))
        self._busy = 0
        self._pending_jobs: Dict[str, _Item] = {}
        self.last_error: Optional[BaseException] = None

        self._slots = threading.Semaphore(self.max_in_flight)
        self._queue: "queue.SimpleQueue[Optional[_Item]]" = queue.SimpleQueue()
        self._closed = False
        self._threads: List[threading.Thread] = []
        for i in range(self.max_in_flight):
            t = threading.Thread(target=self._worker, name=f"attnaudit-send-{i}",
                                 daemon=True)
            t.start()
            self._threads.append(t)
        self._poller = None
        if mode == "submit":
            self._poller = threading.Thread(target=self._poll_jobs,
                                            name="attnaudit-poll", daemon=True)
            self._poller.start()

    # ------------------------------------------------------------------
    # The hook
    # ------------------------------------------------------------------

    def step(self, snapshot_or_builder: Any, *, layer: Optional[int] = None,
             step: Optional[int] = None, run: Optional[str] = None) -> bool:
        """Offers one attention call. Returns True when it was sampled and
        queued; False when it was not sampled or was dropped. Never blocks
        on the server; raises nothing (a builder's exception is counted as
        failed and kept in last_error). layer, step, run: labels for a
        snapshot that has none (run defaults to the auditor's)."""
        self._steps += 1
        if step is None:
            step = self._auto_step.get(layer, 0)
            self._auto_step[layer] = step + 1
        k = step - self.offset
        if k % self.sample_every:
            return False
        if self._layers is not None and self._layer_set is not None:
            if self._rotate:
                if layer != self._layers[(k // self.sample_every) % len(self._layers)]:
                    return False
            elif layer not in self._layer_set:
                return False
        return self._sample(snapshot_or_builder, layer, step,
                            self.run if run is None else run)

    def _sample(self, snapshot_or_builder: Any, layer: Any, step: Any, run: Any) -> bool:
        self._sampled += 1
        if self._closed or not self._slots.acquire(blocking=False):
            self._dropped += 1
            return False
        try:
            snapshot = self._build(snapshot_or_builder)
            if not isinstance(snapshot, Snapshot):
                raise TypeError(f"the builder returned {type(snapshot).__name__}, "
                                "not an attnaudit.Snapshot")
            labels = snapshot.labels
            if layer is not None and not labels.HasField("layer"):
                labels.layer = int(layer)
            if not labels.HasField("step"):
                labels.step = int(step)
            if run and not labels.run:
                labels.run = str(run)
        except Exception as e:  # noqa: BLE001 - never break the rollout loop
            self._slots.release()
            self._record(_Item(None, step, layer), None, e)
            return False
        item = _Item(snapshot, step, layer, done=concurrent.futures.Future())
        with self._lock:
            self._busy += 1
            self._outstanding.add(item.done)
        self._queue.put(item)
        return True

    def _build(self, snapshot_or_builder: Any) -> Snapshot:
        if not callable(snapshot_or_builder):
            return snapshot_or_builder
        torch = sys.modules.get("torch")
        if (not self._side_stream or torch is None or not torch.cuda.is_available()
                or not torch.cuda.is_initialized()):
            return snapshot_or_builder()
        # CUDA: gather on a side stream ordered after the engine's work so
        # far; the engine's stream then waits only for the gather (its next
        # kernels must not overwrite pages before they are read), never for
        # the copy to the host.
        main = torch.cuda.current_stream()
        side = self._streams.get(main.device)
        if side is None:
            side = torch.cuda.Stream(device=main.device)
            self._streams[main.device] = side
        side.wait_stream(main)
        with torch.cuda.stream(side):
            snapshot = snapshot_or_builder()
        event = getattr(snapshot, "gathered_event", None)
        if event is not None:
            main.wait_event(event)
        else:
            main.wait_stream(side)
        return snapshot

    # ------------------------------------------------------------------
    # Background
    # ------------------------------------------------------------------

    def _worker(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            try:
                self._send(item)
            finally:
                item.snapshot = None
                self._slots.release()
                with self._lock:
                    self._busy -= 1
                    item.released = True
                    # A submitted job is finished when the poller has its
                    # outcome too.
                    finished = item.job_id is None or item.recorded
                if finished:
                    self._finish(item)

    def _finish(self, item: _Item) -> None:
        with self._lock:
            self._outstanding.discard(item.done)
        if item.done is not None:
            item.done.set_result(None)

    def _send(self, item: _Item) -> None:
        try:
            if self._mode == "audit":
                report = self._client.audit(item.snapshot, timeout=self._timeout,
                                            priority=self._priority, options=self._options)
                with self._lock:
                    self._counts["sent"] += 1
                self._record(item, report, None)
            else:
                submitted = self._client.submit(item.snapshot, timeout=self._timeout,
                                                priority=self._priority,
                                                options=self._options)
                with self._lock:
                    self._counts["sent"] += 1
                    item.submitted_at = time.monotonic()
                    item.job_id = submitted.job_id
                    self._pending_jobs[submitted.job_id] = item
                    item.snapshot = None
        except Exception as e:  # noqa: BLE001 - counted, kept, never raised
            self._record(item, None, e)

    def _poll_jobs(self) -> None:
        while not self._stop_polling:
            time.sleep(self._poll_interval)
            with self._lock:
                jobs = list(self._pending_jobs.items())
            for job_id, item in jobs:
                try:
                    result = self._client.get(job_id, timeout=self._timeout)
                except AuditError as e:
                    # NOT_FOUND soon after Submit: the replica asked may not
                    # see the job yet; later it is final.
                    if (e.code.name == "NOT_FOUND" and time.monotonic()
                            - item.submitted_at >= self._not_found_grace):
                        with self._lock:
                            self._pending_jobs.pop(job_id, None)
                        self._collected(item, None, e, job_id)
                    continue  # unreachable server: try again next round
                if not result.done:
                    continue
                with self._lock:
                    self._pending_jobs.pop(job_id, None)
                self._collected(item, result.report, result.error, job_id)

    _stop_polling = False

    def _collected(self, item: _Item, report: Optional[Report],
                   error: Optional[BaseException], job_id: str) -> None:
        """A submitted job's outcome, from the poller."""
        try:
            self._record(item, report, error, job_id)
        finally:
            with self._lock:
                item.recorded = True
                finished = item.released
            if finished:
                self._finish(item)

    def _record(self, item: _Item, report: Optional[Report],
                error: Optional[BaseException], job_id: Optional[str] = None) -> None:
        verdict = report.verdict if report is not None else None
        if isinstance(error, InvalidArgumentError):
            verdict = Verdict.INVALID
        result = AuditResult(item.step, item.layer, verdict, report, error, job_id)
        with self._lock:
            if report is not None:
                if verdict == Verdict.PASS:
                    self._counts["passed"] += 1
                elif verdict == Verdict.DRIFT:
                    self._counts["drifted"] += 1
                elif verdict == Verdict.INCONCLUSIVE:
                    self._counts["inconclusive"] += 1
                elif verdict == Verdict.INVALID:
                    self._counts["invalid"] += 1
            elif isinstance(error, InvalidArgumentError):
                self._counts["invalid"] += 1
                self.last_error = error
            else:
                self._counts["failed"] += 1
                self.last_error = error
            # Audits finish out of order: keep the newest step per layer.
            prev = self._latest.get(item.layer)
            if prev is None or prev.step is None or item.step is None or item.step >= prev.step:
                self._latest[item.layer] = result
            self._recent.append(result)
        if error is not None and not isinstance(error, AuditError):
            _warn_once(error)
        if self._on_result is not None:
            try:
                self._on_result(result)
            except Exception:  # noqa: BLE001 - a user callback must not kill us
                with self._lock:
                    self._counts["callback_errors"] += 1

    # ------------------------------------------------------------------
    # Results and lifecycle
    # ------------------------------------------------------------------

    @property
    def counters(self) -> AuditorCounters:
        with self._lock:
            c = dict(self._counts)
        return AuditorCounters(steps=self._steps, sampled=self._sampled,
                               dropped=self._dropped, **c)

    @property
    def in_flight(self) -> int:
        """Snapshots held now (queued or being sent)."""
        with self._lock:
            return self._busy

    @property
    def outstanding(self) -> int:
        """Sampled snapshots without an outcome yet: held, being sent, or
        (submit mode) submitted and not yet collected."""
        with self._lock:
            return sum(1 for f in self._outstanding if not f.done())

    @property
    def latest(self) -> Dict[Optional[int], AuditResult]:
        """The result of the newest audited step of every layer seen."""
        with self._lock:
            return dict(self._latest)

    @property
    def latest_verdicts(self) -> Dict[Optional[int], Optional[Verdict]]:
        with self._lock:
            return {k: r.verdict for k, r in self._latest.items()}

    def results(self) -> List[AuditResult]:
        """The most recent results, oldest first."""
        with self._lock:
            return list(self._recent)

    def flush(self, timeout: Optional[float] = None) -> bool:
        """Waits until nothing is in flight (and, in submit mode, every job
        has a result), `timeout` seconds at most in all (None: no limit).
        False if time ran out first."""
        return self._wait_done(None if timeout is None
                               else time.monotonic() + timeout)

    def _wait_done(self, deadline: Optional[float]) -> bool:
        # One wait per round on the futures outstanding at its start; a
        # round ends early only when they are all done, and the next one
        # takes what was sampled meanwhile, against the same deadline.
        while True:
            with self._lock:
                pending = [f for f in self._outstanding if not f.done()]
            if not pending:
                return True
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return False
            concurrent.futures.wait(pending, timeout=remaining)

    def close(self, timeout: Optional[float] = 30.0) -> bool:
        """Stops sampling (later steps count as dropped), lets in-flight work
        finish for up to `timeout` seconds in all, and stops the threads
        without waiting for them (daemon threads: a send still running ends
        on its own call deadline and is still counted). Returns whether
        everything finished."""
        deadline = None if timeout is None else time.monotonic() + timeout
        self._closed = True
        finished = self._wait_done(deadline)
        self._stop_polling = True
        for _ in self._threads:
            self._queue.put(None)
        return finished

    def __enter__(self) -> "RolloutAuditor":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


_warned_types: set = set()


def _warn_once(error: BaseException) -> None:
    kind = type(error).__name__
    if kind in _warned_types:
        return
    _warned_types.add(kind)
    warnings.warn(f"attnaudit.RolloutAuditor: a sampled snapshot failed: {kind}: "
                  f"{error} (counted in counters.failed; see last_error)",
                  RuntimeWarning, stacklevel=2)
