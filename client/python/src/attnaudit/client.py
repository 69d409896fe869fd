"""AuditClient: the synchronous client of attnaudit-server.

    client = attnaudit.AuditClient("localhost:50051", token=None, tls=None)
    report = client.audit(snapshot)            # blocks until the report
    print(report.verdict, report.engine_vs_reference.out.max_abs)
    job = client.submit(snapshot)              # durable async job
    result = client.wait(job.job_id)           # or get() / watch()
    for s in client.list_results(run="grpo-7", verdict="DRIFT"):
        print(s.job_id, s.layer, s.step, s.diagnosis)
    for p in client.list_pairs(run="grpo-7"):  # train-rollout pairs
        print(p.layer, p.verdict, p.rollout_job_id, p.trainer_job_id)

A fleet of replicas sharing one store: give every address, or one DNS
name that resolves to all of them, and the calls are spread round-robin:

    client = attnaudit.AuditClient(["10.0.0.5:50051", "10.0.0.6:50051"])
    client = attnaudit.AuditClient("dns:///attnaudit-headless:50051")

audit() sends a snapshot over the unary Audit call when it fits
comfortably under the server's receive limit (Capabilities, asked once and
cached) and over the chunked AuditStream call otherwise. Every call has a
deadline (`timeout`, per call or the client's default) and carries the
bearer token when one is set. Failures raise attnaudit.AuditError
subclasses (errors.py) with the gRPC code, the server's message, its field
path and its retry hint.

Thread safety: an AuditClient may be used from many threads at once (gRPC
channels are thread-safe; the capabilities cache is locked). Close it (or
use it as a context manager) to release the channel.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Iterator, Optional, Sequence, Union

import grpc

from attnaudit.v1 import service_pb2

from . import _calls as C
from ._enums import JobState
from .errors import AuditError, DeadlineExceededError, from_rpc_error
from .memfd import MemfdSnapshot
from .report import JobResult, Report
from .results import PairIterator, ResultIterator
from .snapshot import Snapshot


class AuditClient(C.ServiceMethods):
    """Synchronous client (see the module docstring)."""

    def __init__(self, addr: Union[str, Sequence[str]] = "localhost:50051", *,
                 tls: Any = None, token: Optional[str] = None, timeout: float = 120.0,
                 stream_threshold_bytes: Optional[int] = None,
                 chunk_bytes: Optional[int] = None,
                 channel_options: Sequence = ()):
        """addr: the server, or the replicas of a fleet:
          - "HOST:PORT": one address (a name resolves through DNS, and a
            name with several records reaches every one of them);
          - a gRPC target, passed on unchanged: "dns:///attnaudit-headless:50051"
            (re-resolved as the fleet changes: the way to reach a Kubernetes
            headless service), "ipv4:10.0.0.5:50051,10.0.0.6:50051",
            "unix:/run/attnaudit.sock";
          - several HOST:PORT addresses, as a list or a comma-separated
            string: one "ipv4:" (or "ipv6:") target of them all; host names
            among them are resolved once, here, to every address they have
            (UnavailableError if one cannot be), and the first address is
            the authority TLS checks.
        The channel always balances round-robin (gRPC's round_robin policy)
        over every address its target resolves to, so calls spread over
        the fleet; any replica sharing the store answers for any job. A
        channel_options entry overrides ("grpc.lb_policy_name", ...).
        tls: None (plaintext), True (system roots), or attnaudit.Tls / a
        dict (ca, cert, key, server_name). token: sent as "authorization:
        Bearer <token>". timeout: default deadline of a call, seconds.
        stream_threshold_bytes / chunk_bytes: override the transport choice
        and the AuditStream chunk size."""
        target, creds, options = C.channel_args(addr, tls, channel_options)
        self.target = target
        self._channel = (grpc.secure_channel(target, creds, options) if creds
                         else grpc.insecure_channel(target, options))
        self._metadata = C.metadata(token)
        self.timeout = timeout
        self._threshold = stream_threshold_bytes
        self._chunk = chunk_bytes
        self._caps = None
        self._caps_lock = threading.Lock()
        C.bind_methods(self, self._channel)

    # -- lifecycle -----------------------------------------------------------

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "AuditClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def wait_for_ready(self, timeout: float = 10.0) -> None:
        """Blocks until the channel is connected; UnavailableError if not
        within `timeout` seconds."""
        try:
            grpc.channel_ready_future(self._channel).result(timeout=timeout)
        except grpc.FutureTimeoutError:
            from .errors import UnavailableError
            raise UnavailableError(grpc.StatusCode.UNAVAILABLE,
                                   f"not connected within {timeout} s") from None

    # -- calls ---------------------------------------------------------------

    def _call(self, method: Any, request: Any, timeout: Optional[float]) -> Any:
        try:
            return method(request, timeout=self.timeout if timeout is None else timeout,
                          metadata=self._metadata)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None

    def capabilities(self, refresh: bool = False, *,
                     timeout: Optional[float] = None) -> service_pb2.Capabilities:
        """The server's version, backends, devices and limits (cached).
        timeout: the call's deadline when it is asked (None: the client's)."""
        with self._caps_lock:
            if self._caps is not None and not refresh:
                return self._caps
        caps = self._call(self._capabilities, b"", timeout)
        with self._caps_lock:
            self._caps = caps
        return caps

    def audit(self, snapshot: Snapshot, *, timeout: Optional[float] = None,
              priority: Any = None, options: Any = None,
              transport: str = "auto") -> Report:
        """Audits `snapshot` and returns its report (PASS or DRIFT; a
        snapshot that fails validation raises InvalidArgumentError with the
        field path). priority: "interactive" (default) or "sampled".
        options: attnaudit.v1.AuditOptions or a dict (see _calls.audit_options).
        transport: "auto", "unary", "stream" or "memfd" (shared memory with a
        server on this machine started with --accept-memfd-snapshots; to
        reuse one memfd across audits, see audit_memfd)."""
        if transport == "memfd":
            with MemfdSnapshot(snapshot) as m:
                return self.audit_memfd(m, timeout=timeout, priority=priority,
                                        options=options)
        opts, prio = C.audit_options(options), C.priority(priority)
        threshold = C.stream_threshold(
            self._known_caps(transport == "auto" and not self._threshold, timeout),
            self._threshold)
        if C.choose_transport(transport, snapshot, threshold) == "stream":
            chunk = C.chunk_size(self._known_caps(not self._chunk, timeout), self._chunk)
            messages = C.stream_messages(snapshot, opts, prio, chunk)
            response = self._call(self._stream, messages, timeout)
        else:
            response = self._call(self._audit, C.audit_request(snapshot, opts, prio),
                                  timeout)
        return Report(response.report)

    def audit_memfd(self, memfd: MemfdSnapshot, *,
                    timeout: Optional[float] = None, priority: Any = None,
                    options: Any = None) -> Report:
        """Audits the snapshot in `memfd` (attnaudit.MemfdSnapshot), which a
        server on this machine with --accept-memfd-snapshots reads in place;
        memfd.write() the next snapshot only after this returns."""
        opts, prio = C.audit_options(options), C.priority(priority)
        response = self._call(self._audit, C.memfd_audit_request(memfd, opts, prio),
                              timeout)
        return Report(response.report)

    def _known_caps(self, needed: bool,
                    timeout: Optional[float]) -> Optional[service_pb2.Capabilities]:
        """The capabilities when `needed` (asked once, under the deadline of
        the call that needs them), else what is cached."""
        if not needed:
            return self._caps
        try:
            return self.capabilities(timeout=timeout)
        except AuditError:
            return None  # the call itself will report the problem

    def submit(self, snapshot: Snapshot, *, timeout: Optional[float] = None,
               priority: Any = None, options: Any = None,
               idempotency_key: Optional[str] = None,
               job_timeout: Optional[float] = None) -> C.Submitted:
        """Queues a durable audit job (default priority "sampled"); returns
        its id. Retrying with the same idempotency_key never creates a
        second job. job_timeout: seconds the job may wait and run."""
        request = C.submit_request(snapshot, C.audit_options(options), C.priority(priority),
                                   idempotency_key, job_timeout)
        r = self._call(self._submit, request, timeout)
        return C.Submitted(r.job_id, r.deduplicated)

    def get(self, job_id: str, *, timeout: Optional[float] = None) -> JobResult:
        """The job's current state, with its report once DONE."""
        return JobResult(self._call(
            self._get, C.id_request(service_pb2.GetResultRequest, job_id), timeout))

    def wait(self, job_id: str, *, timeout: float = 60.0, poll: float = 0.1) -> JobResult:
        """Polls get() until the job finished; DeadlineExceededError after
        `timeout` seconds."""
        end = time.monotonic() + timeout
        while True:
            result = self.get(job_id)
            if result.done:
                return result
            if time.monotonic() >= end:
                raise DeadlineExceededError(
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    f"job {job_id} still {result.state.name} after {timeout} s")
            time.sleep(poll)

    def cancel(self, job_id: str, *, timeout: Optional[float] = None) -> JobState:
        """Cancels a queued or running job; returns its JobState afterwards."""
        r = self._call(self._cancel, C.id_request(service_pb2.CancelRequest, job_id),
                       timeout)
        return JobState(r.state)

    def list_results(self, *, model: Optional[str] = None, layer: Optional[int] = None,
                     engine: Optional[str] = None, backend: Optional[str] = None,
                     verdict: Any = None, diagnosis: Optional[str] = None,
                     step: Optional[int] = None, run: Optional[str] = None,
                     state: Any = None, since: Any = None, until: Any = None,
                     page_size: int = 100, limit: Optional[int] = None,
                     timeout: Optional[float] = None) -> ResultIterator:
        """The stored results (finished jobs, Submit's and Audit's) that
        match every criterion given, newest first, as an iterator of
        attnaudit.ResultSummary views read a page at a time.

        model, engine, backend, run, layer, step: the snapshot's labels.
        verdict: "PASS", "DRIFT", ... (a DONE job's). diagnosis: the top
        hypothesis of a DRIFT, e.g. "stale-page". state: "DONE", "FAILED"
        or "CANCELLED" (None: all three). since / until: finished at or
        after / before, each given as seconds ago, a timedelta ago, or a
        datetime. page_size: results per ListResults call (1 to 1000).
        limit: stop after this many results (None: all). timeout: the
        deadline of each page's call.

        The iterator's to_pandas() / to_parquet(path) tabulate what is left
        of it (attnaudit.results_to_pandas). Errors of the server (e.g.
        InvalidArgumentError for a state it cannot list) are raised when
        the page is read."""
        request = C.list_request(model=model, layer=layer, engine=engine,
                                 backend=backend, verdict=verdict, diagnosis=diagnosis,
                                 step=step, run=run, state=state, since=since,
                                 until=until, page_size=page_size)
        return ResultIterator(lambda r: self._call(self._list, r, timeout), request, limit)

    def list_pairs(self, *, run: Optional[str] = None, layer: Optional[int] = None,
                   verdict: Any = None, step: Optional[int] = None,
                   request_id: Optional[str] = None, since: Any = None, until: Any = None,
                   page_size: int = 100, limit: Optional[int] = None,
                   timeout: Optional[float] = None) -> PairIterator:
        """The train-rollout pairs the server joined (a rollout snapshot
        and a trainer snapshot, labelled with their role, of one run and
        layer that hold common (request id, position) rows, each audited)
        that match every criterion given, newest first, as an iterator of
        attnaudit.PairResult views read a page at a time.

        run, layer: the pair's. verdict: the pair's ("consistent",
        "within-noise", "inputs-differ", "stale-prefix-kv",
        "rollout-drift", "trainer-drift", "both-drift"). step: either
        side's step label. request_id: a request id the pair's rows hold.
        since / until: joined at or after / before, each given as seconds
        ago, a timedelta ago, or a datetime. page_size: pairs per ListPairs
        call (1 to 1000). limit: stop after this many pairs (None: all).
        timeout: the deadline of each page's call.

        The iterator's to_records() / to_pandas() give one row per pair
        row. The server joins asynchronously, after both sides' audits:
        a pair appears shortly after its second side was audited."""
        request = C.pairs_request(run=run, layer=layer, verdict=verdict, step=step,
                                  request_id=request_id, since=since, until=until,
                                  page_size=page_size)
        return PairIterator(lambda r: self._call(self._list_pairs, r, timeout), request,
                            limit)

    def watch(self, *, model: Optional[str] = None, layer: Optional[int] = None,
              engine: Optional[str] = None, backend: Optional[str] = None,
              verdicts: Optional[Sequence] = None,
              timeout: Optional[float] = None,
              resume_after: Optional[int] = None) -> "Watch":
        """Streams the results of jobs that finish from now on and match the
        filter (every criterion given must match). Iterate over the returned
        Watch; it ends after `timeout` seconds (None: never) or cancel().
        The call starts at once, but the server registers it asynchronously:
        a job that finishes within milliseconds of this call may be missed.

        resume_after: a cursor (JobResult.cursor of the last result seen,
        or 0 for the beginning): the server first replays every stored
        result after it, in cursor order, then continues with live ones,
        missing and repeating none -- so a watcher that reconnects (to any
        replica of a fleet) continues where it stopped. The server refuses
        it with OUT_OF_RANGE (an AuditError) when more than 10000 results,
        or results it has pruned, lie between; read those with
        list_results() and watch again."""
        request = C.watch_request(model, layer, engine, backend, verdicts, resume_after)
        try:
            call = self._watch(request, timeout=timeout, metadata=self._metadata)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        return Watch(call, bounded=timeout is not None)


class Watch:
    """An open WatchResults call: iterate for JobResult views. A deadline
    given at watch() ends the iteration quietly; other errors raise."""

    def __init__(self, call: Any, bounded: bool):
        self._call = call
        self._bounded = bounded
        self._cancelled = False

    def __iter__(self) -> Iterator[JobResult]:
        return self

    def __next__(self) -> JobResult:
        try:
            return JobResult(next(self._call))
        except StopIteration:
            raise
        except grpc.RpcError as e:
            code = e.code()
            if self._cancelled:
                raise StopIteration from None
            if self._bounded and code == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise StopIteration from None
            raise from_rpc_error(e) from None

    def cancel(self) -> None:
        self._cancelled = True
        self._call.cancel()

    def __enter__(self) -> "Watch":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.cancel()
