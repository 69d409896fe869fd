"""The clients' retry policy (gRPC's, from the channel's service config)
against a scripted in-process AuditService: which calls are resent on
which codes, and that the server's grpc-retry-pushback-ms trailer decides
whether and when; and that the capabilities an audit needs are asked under
that audit's deadline."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import threading
import time

import grpc
import pytest

import attnaudit
import attnaudit.aio
from attnaudit import _calls
from attnaudit.v1 import service_pb2
from test_client import tiny


class Script:
    """Fails the first `failures` attempts of a method with `code` (and a
    grpc-retry-pushback-ms trailer when `pushback` is set); records when
    each attempt arrived."""

    def __init__(self):
        self.lock = threading.Lock()
        self.set(grpc.StatusCode.OK, 0, None)

    def set(self, code, failures, pushback):
        with self.lock:
            self.code, self.failures, self.pushback = code, failures, pushback
            self.arrivals = []

    def attempt(self, context, response):
        with self.lock:
            self.arrivals.append(time.monotonic())
            if len(self.arrivals) > self.failures:
                return response
            if self.pushback is not None:
                context.set_trailing_metadata((("grpc-retry-pushback-ms", self.pushback),))
            code = self.code
        context.abort(code, "scripted refusal")


@pytest.fixture
def scripted():
    script = Script()

    def get_result(request, context):
        return script.attempt(context, service_pb2.JobResult(job_id=request.job_id))

    def submit(request, context):
        return script.attempt(context, service_pb2.SubmitResponse(job_id="s1"))

    def get_capabilities(request, context):
        script.caps_deadlines.append(context.time_remaining())
        return service_pb2.Capabilities()

    script.caps_deadlines = []
    handlers = {
        "GetCapabilities": grpc.unary_unary_rpc_method_handler(
            get_capabilities, request_deserializer=None,
            response_serializer=service_pb2.Capabilities.SerializeToString),
        "GetResult": grpc.unary_unary_rpc_method_handler(
            get_result, request_deserializer=service_pb2.GetResultRequest.FromString,
            response_serializer=service_pb2.JobResult.SerializeToString),
        "Submit": grpc.unary_unary_rpc_method_handler(
            submit, request_deserializer=service_pb2.SubmitRequest.FromString,
            response_serializer=service_pb2.SubmitResponse.SerializeToString),
    }
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("attnaudit.v1.AuditService", handlers),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield script, f"127.0.0.1:{port}"
    server.stop(None)


def test_a_positive_pushback_is_waited_and_the_call_resent(scripted):
    script, addr = scripted
    # Far above the policy's backoff (0.2 s initial, jittered below it), so
    # the gap shows which of the two set the wait.
    script.set(grpc.StatusCode.RESOURCE_EXHAUSTED, 1, "1500")
    with attnaudit.AuditClient(addr) as client:
        assert client.get("j1").job_id == "j1"
    assert len(script.arrivals) == 2
    assert script.arrivals[1] - script.arrivals[0] >= 1.5


def test_a_negative_pushback_ends_the_call_at_once(scripted):
    script, addr = scripted
    script.set(grpc.StatusCode.RESOURCE_EXHAUSTED, 1, "-1")
    with attnaudit.AuditClient(addr) as client:
        with pytest.raises(attnaudit.ResourceExhaustedError):
            client.get("j1")
    assert len(script.arrivals) == 1


def test_unavailable_reads_are_retried_and_attempts_are_bounded(scripted):
    script, addr = scripted
    script.set(grpc.StatusCode.UNAVAILABLE, 2, None)
    with attnaudit.AuditClient(addr) as client:
        assert client.get("j1").job_id == "j1"
    assert len(script.arrivals) == 3
    script.set(grpc.StatusCode.UNAVAILABLE, 10, "1")
    with attnaudit.AuditClient(addr) as client:
        with pytest.raises(attnaudit.UnavailableError):
            client.get("j1")
    assert len(script.arrivals) == 4  # the policy's maxAttempts


def test_submit_is_resent_only_after_an_admission_refusal(scripted):
    script, addr = scripted
    snapshot = tiny()
    with attnaudit.AuditClient(addr) as client:
        script.set(grpc.StatusCode.RESOURCE_EXHAUSTED, 1, "1")
        assert client.submit(snapshot).job_id == "s1"
        assert len(script.arrivals) == 2
        # UNAVAILABLE may have stored the job: never resent.
        script.set(grpc.StatusCode.UNAVAILABLE, 1, "1")
        with pytest.raises(attnaudit.UnavailableError):
            client.submit(snapshot)
        assert len(script.arrivals) == 1


def test_the_asyncio_client_has_the_same_policy(scripted):
    script, addr = scripted
    script.set(grpc.StatusCode.RESOURCE_EXHAUSTED, 1, "1")

    async def go():
        async with attnaudit.aio.AuditClient(addr) as client:
            return await client.get("j1")

    assert asyncio.run(go()).job_id == "j1"
    assert len(script.arrivals) == 2


def test_retries_can_be_turned_off_and_the_hint_is_still_read(scripted):
    script, addr = scripted
    script.set(grpc.StatusCode.RESOURCE_EXHAUSTED, 1, "250")
    with attnaudit.AuditClient(addr, channel_options=[("grpc.enable_retries", 0)]) as client:
        with pytest.raises(attnaudit.ResourceExhaustedError) as e:
            client.get("j1")
    assert len(script.arrivals) == 1
    assert e.value.retry_after == 0.25


def test_the_service_config_names_real_methods():
    names = {m.name for m in service_pb2.DESCRIPTOR.services_by_name["AuditService"].methods}
    config = json.loads(_calls.RETRY_SERVICE_CONFIG)
    for entry in config["methodConfig"]:
        for name in entry["name"]:
            assert name["method"] in names
    # Every RPC has a policy, once, except a client stream (its messages
    # are not buffered for a resend): a new RPC must choose its codes.
    named = [n["method"] for e in config["methodConfig"] for n in e["name"]]
    service = service_pb2.DESCRIPTOR.services_by_name["AuditService"]
    assert sorted(named) == sorted(m.name for m in service.methods
                                   if not m.client_streaming)
    submit = [e for e in config["methodConfig"]
              if {"service": "attnaudit.v1.AuditService", "method": "Submit"} in e["name"]]
    assert submit[0]["retryPolicy"]["retryableStatusCodes"] == ["RESOURCE_EXHAUSTED"]


def test_the_capabilities_an_audit_needs_are_asked_under_its_deadline(scripted):
    script, addr = scripted
    # The client's default deadline is 60 s; the audit's own is 5 s. (The
    # scripted service has no Audit: the audit itself fails UNIMPLEMENTED.)
    with attnaudit.AuditClient(addr, timeout=60) as client:
        with pytest.raises(attnaudit.AuditError):
            client.audit(tiny(), timeout=5)
    # The grpc-timeout header rounds the deadline up to its unit, so the
    # server may see a little over 5 s; what matters is that it is not 60.
    assert len(script.caps_deadlines) == 1
    assert 0 < script.caps_deadlines[0] <= 6

    async def go():
        async with attnaudit.aio.AuditClient(addr, timeout=60) as client:
            with pytest.raises(attnaudit.AuditError):
                await client.audit(tiny(), timeout=5)

    asyncio.run(go())
    assert len(script.caps_deadlines) == 2
    assert 0 < script.caps_deadlines[1] <= 6
