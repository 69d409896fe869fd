"""attnaudit.aio.AuditClient: the asyncio twin of attnaudit.AuditClient.

Same methods, arguments, transport choice and typed errors; every call is a
coroutine, and watch() returns an async iterator:

    async with attnaudit.aio.AuditClient("localhost:50051") as client:
        report = await client.audit(snapshot)
        async for result in client.watch(verdicts=["DRIFT"], timeout=60):
            ...
        async for summary in client.list_results(run="grpo-7", since=3600):
            ...

Use one client per event loop (grpc.aio channels are bound to the loop that
created them).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncIterator, Iterator, Optional, Sequence, Union

import grpc
import grpc.aio

from attnaudit.v1 import service_pb2

from . import _calls as C
from ._enums import JobState
from .errors import AuditError, DeadlineExceededError, UnavailableError, from_rpc_error
from .memfd import MemfdSnapshot
from .report import JobResult, Report
from .results import AsyncPairIterator, AsyncResultIterator
from .snapshot import Snapshot

Submitted = C.Submitted


class AuditClient(C.ServiceMethods):
    """Asyncio client (see the module docstring and attnaudit.AuditClient)."""

    def __init__(self, addr: Union[str, Sequence[str]] = "localhost:50051", *,
                 tls: Any = None, token: Optional[str] = None, timeout: float = 120.0,
                 stream_threshold_bytes: Optional[int] = None,
                 chunk_bytes: Optional[int] = None,
                 channel_options: Sequence = ()):
        """As attnaudit.AuditClient: addr is one HOST:PORT, a gRPC target
        ("dns:///attnaudit-headless:50051"), or the replicas of a fleet as
        a list or a comma-separated string; calls are balanced round-robin
        over every address the target resolves to."""
        target, creds, options = C.channel_args(addr, tls, channel_options)
        self.target = target
        self._channel = (grpc.aio.secure_channel(target, creds, options) if creds
                         else grpc.aio.insecure_channel(target, options))
        self._metadata = C.metadata(token)
        self.timeout = timeout
        self._threshold = stream_threshold_bytes
        self._chunk = chunk_bytes
        self._caps = None
        C.bind_methods(self, self._channel)

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> "AuditClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def wait_for_ready(self, timeout: float = 10.0) -> None:
        try:
            await asyncio.wait_for(self._channel.channel_ready(), timeout)
        except asyncio.TimeoutError:
            raise UnavailableError(grpc.StatusCode.UNAVAILABLE,
                                   f"not connected within {timeout} s") from None

    async def _call(self, method: Any, request: Any, timeout: Optional[float]) -> Any:
        try:
            return await method(request, timeout=self.timeout if timeout is None else timeout,
                                metadata=self._metadata)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None

    async def capabilities(self, refresh: bool = False, *,
                           timeout: Optional[float] = None) -> service_pb2.Capabilities:
        caps = self._caps
        if caps is None or refresh:
            caps = self._caps = await self._call(self._capabilities, b"", timeout)
        return caps

    async def audit(self, snapshot: Snapshot, *, timeout: Optional[float] = None,
                    priority: Any = None, options: Any = None,
                    transport: str = "auto") -> Report:
        opts, prio = C.audit_options(options), C.priority(priority)
        loop = asyncio.get_running_loop()
        if transport == "memfd":  # as AuditClient.audit
            memfd = await loop.run_in_executor(None, MemfdSnapshot, snapshot)
            try:
                response = await self._call(
                    self._audit, C.memfd_audit_request(memfd, opts, prio), timeout)
            finally:
                memfd.close()
            return Report(response.report)
        threshold = C.stream_threshold(
            await self._known_caps(transport == "auto" and not self._threshold, timeout),
            self._threshold)
        # Encoding copies the snapshot's bytes once and may wait for a
        # device copy: keep it off the event loop.
        if C.choose_transport(transport, snapshot, threshold) == "stream":
            chunk = C.chunk_size(await self._known_caps(not self._chunk, timeout), self._chunk)
            await loop.run_in_executor(None, snapshot.wait)
            messages = _off_loop(C.stream_messages(snapshot, opts, prio, chunk))
            response = await self._call(self._stream, messages, timeout)
        else:
            request = await loop.run_in_executor(None, C.audit_request, snapshot, opts, prio)
            response = await self._call(self._audit, request, timeout)
        return Report(response.report)

    async def _known_caps(self, needed: bool,
                          timeout: Optional[float]) -> Optional[service_pb2.Capabilities]:
        # Asked under the deadline of the call that needs them.
        if not needed:
            return self._caps
        try:
            return await self.capabilities(timeout=timeout)
        except AuditError:
            return None

    async def submit(self, snapshot: Snapshot, *, timeout: Optional[float] = None,
                     priority: Any = None, options: Any = None,
                     idempotency_key: Optional[str] = None,
                     job_timeout: Optional[float] = None) -> C.Submitted:
        loop = asyncio.get_running_loop()
        request = await loop.run_in_executor(
            None, C.submit_request, snapshot, C.audit_options(options),
            C.priority(priority), idempotency_key, job_timeout)
        r = await self._call(self._submit, request, timeout)
        return C.Submitted(r.job_id, r.deduplicated)

    async def get(self, job_id: str, *, timeout: Optional[float] = None) -> JobResult:
        return JobResult(await self._call(
            self._get, C.id_request(service_pb2.GetResultRequest, job_id), timeout))

    async def wait(self, job_id: str, *, timeout: float = 60.0,
                   poll: float = 0.1) -> JobResult:
        end = time.monotonic() + timeout
        while True:
            result = await self.get(job_id)
            if result.done:
                return result
            if time.monotonic() >= end:
                raise DeadlineExceededError(
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    f"job {job_id} still {result.state.name} after {timeout} s")
            await asyncio.sleep(poll)

    async def cancel(self, job_id: str, *, timeout: Optional[float] = None) -> JobState:
        r = await self._call(self._cancel, C.id_request(service_pb2.CancelRequest, job_id),
                             timeout)
        return JobState(r.state)

    def list_results(self, *, model: Optional[str] = None, layer: Optional[int] = None,
                     engine: Optional[str] = None, backend: Optional[str] = None,
                     verdict: Any = None, diagnosis: Optional[str] = None,
                     step: Optional[int] = None, run: Optional[str] = None,
                     state: Any = None, since: Any = None, until: Any = None,
                     page_size: int = 100, limit: Optional[int] = None,
                     timeout: Optional[float] = None) -> AsyncResultIterator:
        """As attnaudit.AuditClient.list_results, as an async iterator
        (`async for`; `await it.to_pandas()`)."""
        request = C.list_request(model=model, layer=layer, engine=engine,
                                 backend=backend, verdict=verdict, diagnosis=diagnosis,
                                 step=step, run=run, state=state, since=since,
                                 until=until, page_size=page_size)
        return AsyncResultIterator(lambda r: self._call(self._list, r, timeout),
                                   request, limit)

    def list_pairs(self, *, run: Optional[str] = None, layer: Optional[int] = None,
                   verdict: Any = None, step: Optional[int] = None,
                   request_id: Optional[str] = None, since: Any = None, until: Any = None,
                   page_size: int = 100, limit: Optional[int] = None,
                   timeout: Optional[float] = None) -> AsyncPairIterator:
        """As attnaudit.AuditClient.list_pairs, as an async iterator
        (`async for`; `await it.to_list()`)."""
        request = C.pairs_request(run=run, layer=layer, verdict=verdict, step=step,
                                  request_id=request_id, since=since, until=until,
                                  page_size=page_size)
        return AsyncPairIterator(lambda r: self._call(self._list_pairs, r, timeout),
                                 request, limit)

    def watch(self, *, model: Optional[str] = None, layer: Optional[int] = None,
              engine: Optional[str] = None, backend: Optional[str] = None,
              verdicts: Optional[Sequence] = None,
              timeout: Optional[float] = None,
              resume_after: Optional[int] = None) -> "Watch":
        """As attnaudit.AuditClient.watch (resume_after included)."""
        request = C.watch_request(model, layer, engine, backend, verdicts, resume_after)
        call = self._watch(request, timeout=timeout, metadata=self._metadata)
        return Watch(call, bounded=timeout is not None)


async def _off_loop(messages: Iterator[bytes]) -> AsyncIterator[bytes]:
    """The stream's messages, each encoded (a chunk copy) on the default
    executor so the event loop never stalls on a large snapshot."""
    loop = asyncio.get_running_loop()
    while True:
        message = await loop.run_in_executor(None, next, messages, None)
        if message is None:
            return
        yield message


class Watch:
    """An open WatchResults call: `async for result in watch`."""

    def __init__(self, call: Any, bounded: bool):
        self._call = call
        self._bounded = bounded
        self._cancelled = False

    def __aiter__(self) -> AsyncIterator[JobResult]:
        return self

    async def __anext__(self) -> JobResult:
        try:
            message = await self._call.read()
        except asyncio.CancelledError:
            if self._cancelled:
                raise StopAsyncIteration from None
            raise
        except grpc.RpcError as e:
            if self._cancelled:
                raise StopAsyncIteration from None
            if self._bounded and e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise StopAsyncIteration from None
            raise from_rpc_error(e) from None
        if message is grpc.aio.EOF:
            if self._bounded and await self._call.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise StopAsyncIteration
            if self._cancelled:
                raise StopAsyncIteration
            code = await self._call.code()
            if code != grpc.StatusCode.OK:
                raise from_rpc_error(_Finished(code, await self._call.details()))
            raise StopAsyncIteration
        return JobResult(message)

    def cancel(self) -> None:
        self._cancelled = True
        self._call.cancel()

    async def __aenter__(self) -> "Watch":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.cancel()


class _Finished(grpc.RpcError):
    """A finished call's status in the shape from_rpc_error reads."""

    def __init__(self, code: Any, details: Any):
        super().__init__()
        self._code, self._details = code, details

    def code(self) -> Any:
        return self._code

    def details(self) -> Any:
        return self._details

    def trailing_metadata(self) -> None:
        return None
