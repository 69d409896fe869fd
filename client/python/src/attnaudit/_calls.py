"""What the sync and asyncio clients share: channel set-up, request
encoding, transport choice and argument parsing. No I/O happens here."""

from __future__ import annotations

import dataclasses
import datetime
import ipaddress
import json
import os
import socket
import time
from typing import Any, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import grpc

from attnaudit.v1 import report_pb2, service_pb2

from . import _enums as E
from . import _wire
from ._pair_views import verdict_number
from .snapshot import Snapshot

SERVICE = "/attnaudit.v1.AuditService/"


class ServiceMethods:
    """The service's methods as attributes (bind_methods sets them): a
    client class derives from this so that they are declared."""

    _audit: Any
    _stream: Any
    _submit: Any
    _get: Any
    _watch: Any
    _cancel: Any
    _capabilities: Any
    _list: Any
    _list_pairs: Any


def bind_methods(client: ServiceMethods, channel: Any) -> None:
    """Sets client._audit, ._stream, ... to the service's methods on
    `channel` (a grpc.Channel or grpc.aio.Channel: their method factories
    have the same names)."""
    pb = service_pb2
    client._audit = channel.unary_unary(
        SERVICE + "Audit", response_deserializer=pb.AuditResponse.FromString)
    client._stream = channel.stream_unary(
        SERVICE + "AuditStream", response_deserializer=pb.AuditResponse.FromString)
    client._submit = channel.unary_unary(
        SERVICE + "Submit", response_deserializer=pb.SubmitResponse.FromString)
    client._get = channel.unary_unary(
        SERVICE + "GetResult", response_deserializer=pb.JobResult.FromString)
    client._watch = channel.unary_stream(
        SERVICE + "WatchResults", response_deserializer=pb.JobResult.FromString)
    client._cancel = channel.unary_unary(
        SERVICE + "Cancel", response_deserializer=pb.CancelResponse.FromString)
    client._capabilities = channel.unary_unary(
        SERVICE + "GetCapabilities", response_deserializer=pb.Capabilities.FromString)
    client._list = channel.unary_unary(
        SERVICE + "ListResults", response_deserializer=pb.ListResultsResponse.FromString)
    client._list_pairs = channel.unary_unary(
        SERVICE + "ListPairs", response_deserializer=pb.ListPairsResponse.FromString)

# Past this size the stream is faster than one unary message even when the
# unary call would fit (its chunks pipeline encoding, transfer and parsing).
STREAM_ABOVE = 8 << 20
# The receive limit assumed when the server does not state one (gRPC's).
FALLBACK_RECEIVE_LIMIT = 4 << 20
DEFAULT_CHUNK = 2 << 20
MIN_CHUNK = 16 << 10
# Tensors smaller than this travel inline in the AuditStream header.
MIN_STREAMED = 64 << 10
# The scalar fields and framing of a request, generously.
REQUEST_OVERHEAD = 4096


@dataclasses.dataclass(frozen=True)
class Tls:
    """TLS settings. ca: PEM roots that sign the server's certificate (a
    path or the PEM bytes; None: the system roots). cert/key: the client's
    certificate and key for mTLS. server_name: the name checked against the
    server's certificate, when it differs from the address's host."""

    ca: Optional[Union[str, bytes]] = None
    cert: Optional[Union[str, bytes]] = None
    key: Optional[Union[str, bytes]] = None
    server_name: Optional[str] = None


@dataclasses.dataclass(frozen=True)
class Submitted:
    """Answer of submit(): the job id, and whether an idempotency key
    matched an existing job (no new job was created)."""

    job_id: str
    deduplicated: bool


def _pem(value: Any, what: str) -> Optional[bytes]:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value
    if isinstance(value, str) and os.path.exists(value):
        with open(value, "rb") as f:
            return f.read()
    raise ValueError(f"tls.{what}: {value!r} is neither PEM bytes nor a readable file")


# Target schemes gRPC resolves itself: an address starting with one of
# these (and not just "name:port") is handed to the channel unchanged.
_TARGET_SCHEMES = ("dns", "ipv4", "ipv6", "unix", "unix-abstract", "vsock",
                   "xds", "google-c2p")


def _is_grpc_target(addr: str) -> bool:
    if "://" in addr:
        return True
    scheme, sep, rest = addr.partition(":")
    # "dns:50051" is the host "dns" and a port, not a target.
    return bool(sep) and scheme.lower() in _TARGET_SCHEMES and not rest.isdigit()


def _split_host_port(addr: str, what: str) -> Tuple[str, int]:
    """("host", port) of "host:port" or "[v6]:port"."""
    if addr.startswith("["):
        host, sep, port = addr[1:].partition("]:")
    else:
        host, sep, port = addr.rpartition(":")
        if ":" in host:
            raise ValueError(f"{what}: {addr!r}: write an IPv6 address as [ADDR]:PORT")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{what}: {addr!r} is not HOST:PORT")
    return host, int(port)


def _resolve(host: str, port: int, what: str) -> List[ipaddress._BaseAddress]:
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as e:
        from .errors import UnavailableError
        raise UnavailableError(grpc.StatusCode.UNAVAILABLE,
                               f"{what}: cannot resolve {host!r}: {e}") from None
    return [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos]


def channel_target(addr: Any) -> Tuple[str, Optional[str]]:
    """The gRPC target for `addr`, and the authority to announce (None: the
    target's own).

    addr is one "host:port"; a gRPC target ("dns:///name:port",
    "ipv4:10.0.0.1:50051,10.0.0.2:50051", "unix:/path", ...), unchanged;
    or several "host:port" addresses, as a list or one comma-separated
    string. Several addresses become one "ipv4:" target (all IPv4), or an
    "ipv6:" target (IPv4 addresses v4-mapped) when any is IPv6; host names
    among them are resolved here, once, to every address they have, and the
    first address's "host:port" is announced as the authority (what TLS
    checks the certificate against)."""
    if isinstance(addr, str):
        addr = addr.strip()
        if not addr:
            raise ValueError("addr: must not be empty")
        if _is_grpc_target(addr) or "," not in addr:
            return addr, None
        addrs = [a.strip() for a in addr.split(",")]
    elif isinstance(addr, Sequence):
        addrs = [str(a).strip() for a in addr]
        if not addrs:
            raise ValueError("addr: the list of addresses is empty")
    else:
        raise TypeError(f"addr: expected a string or a list of strings, got "
                        f"{type(addr).__name__}")
    if any(not a for a in addrs):
        raise ValueError(f"addr: empty address in {addrs!r}")
    if len(addrs) == 1:
        return channel_target(addrs[0])
    resolved, named = [], None
    for i, a in enumerate(addrs):
        if _is_grpc_target(a):
            raise ValueError(f"addr[{i}]: {a!r} is a gRPC target; a list takes "
                             "HOST:PORT addresses")
        host, port = _split_host_port(a, f"addr[{i}]")
        ips = _resolve(host, port, f"addr[{i}]")
        if named is None and not all(str(ip) == host for ip in ips):
            named = a
        for ip in ips:
            if (ip, port) not in resolved:
                resolved.append((ip, port))
    if all(ip.version == 4 for ip, _ in resolved):
        target = "ipv4:" + ",".join(f"{ip}:{port}" for ip, port in resolved)
    else:
        target = "ipv6:" + ",".join(
            f"[{ip if ip.version == 6 else '::ffff:' + str(ip)}]:{port}"
            for ip, port in resolved)
    return target, (addrs[0] if named is not None else None)


# Every channel balances its calls over all the addresses its target
# resolves to (a list of replicas, or a DNS name with one record per
# replica); with one address this changes nothing.
ROUND_ROBIN = ("grpc.lb_policy_name", "round_robin")


def _retry_policy(codes: Sequence[str]) -> dict:
    return {"maxAttempts": 4, "initialBackoff": "0.2s", "maxBackoff": "5s",
            "backoffMultiplier": 2, "retryableStatusCodes": list(codes)}


def _methods(*names: str) -> List[dict]:
    return [{"service": "attnaudit.v1.AuditService", "method": n} for n in names]


# gRPC's own retry policy (the same as the C++ client's, client/lib/client.h).
# A call answered RESOURCE_EXHAUSTED or UNAVAILABLE is tried again, up to 4
# attempts, after the server's grpc-retry-pushback-ms trailer when it sends
# one (negative: not retried), else after gRPC's jittered backoff. Submit is
# retried on RESOURCE_EXHAUSTED only: that refusal created no job, while an
# UNAVAILABLE Submit without an idempotency key may have been stored, and a
# resend could make a second job. gRPC throttles retries while more than
# half of a channel's recent calls fail (retryThrottling), so an overloaded
# server gets no storm of resends. AuditStream is never retried (its chunks
# are not kept for a resend). Unary requests are kept for a resend up to
# RETRY_BUFFER_BYTES (gRPC's default is 256 KiB): a bit more than the
# largest that audit() sends unary on its own. channel_options may replace
# any of these ("grpc.enable_retries", 0 turns retries off).
RETRY_SERVICE_CONFIG = json.dumps({"methodConfig": [
    {"name": _methods("Audit", "GetResult", "Cancel", "ListResults", "ListPairs",
                      "GetCapabilities", "WatchResults"),
     "retryPolicy": _retry_policy(["RESOURCE_EXHAUSTED", "UNAVAILABLE"])},
    {"name": _methods("Submit"),
     "retryPolicy": _retry_policy(["RESOURCE_EXHAUSTED"])},
], "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.5}})
RETRY_BUFFER_BYTES = 16 << 20
RETRY_OPTIONS = [("grpc.enable_retries", 1),
                 ("grpc.service_config", RETRY_SERVICE_CONFIG),
                 ("grpc.per_rpc_retry_buffer_size", RETRY_BUFFER_BYTES)]


def channel_args(addr: Any, tls: Any, extra: Sequence = ()
                 ) -> Tuple[str, Optional[grpc.ChannelCredentials], List]:
    """(target, credentials or None for plaintext, channel options) of a
    client of `addr` (see channel_target)."""
    target, authority = channel_target(addr)
    creds, options = channel_setup(tls)
    options.append(ROUND_ROBIN)
    extra = list(extra)
    options += [o for o in RETRY_OPTIONS if not any(k == o[0] for k, _ in extra)]
    if authority is not None and not any(k == "grpc.default_authority" for k, _ in extra):
        options.append(("grpc.default_authority", authority))
    return target, creds, options + extra


def channel_setup(tls: Any) -> Tuple[Optional[grpc.ChannelCredentials], List]:
    """(credentials or None for plaintext, channel options)."""
    options: List[Tuple[str, Any]] = [("grpc.max_receive_message_length", 1 << 30),
               ("grpc.max_send_message_length", -1)]
    if tls is None or tls is False:
        return None, options
    if tls is True:
        tls = Tls()
    elif isinstance(tls, Mapping):
        tls = Tls(**tls)
    if not isinstance(tls, Tls):
        raise TypeError("tls: expected None, True, a dict or attnaudit.Tls")
    if (tls.cert is None) != (tls.key is None):
        raise ValueError("tls: cert and key go together")
    creds = grpc.ssl_channel_credentials(root_certificates=_pem(tls.ca, "ca"),
                                         private_key=_pem(tls.key, "key"),
                                         certificate_chain=_pem(tls.cert, "cert"))
    if tls.server_name:
        options.append(("grpc.ssl_target_name_override", tls.server_name))
    return creds, options


def metadata(token: Optional[str]) -> Tuple:
    return (("authorization", f"Bearer {token}"),) if token else ()


def audit_options(options: Any) -> Optional[report_pb2.AuditOptions]:
    """AuditOptions from None, a message or a dict: comparisons (names such
    as "engine_vs_reference"), tolerances (dict out_abs / lse_abs /
    logprob_abs), cp_strategy, include_merge_orders, compute_kv_fingerprint,
    worst_heads."""
    if options is None or isinstance(options, report_pb2.AuditOptions):
        return options
    if not isinstance(options, Mapping):
        raise TypeError("options: expected None, a dict or attnaudit.v1.AuditOptions")
    out = report_pb2.AuditOptions()
    for k, v in options.items():
        if k == "comparisons":
            out.comparisons.extend(
                E.parse_enum(report_pb2.Comparison, "COMPARISON_", c, "options.comparisons")
                for c in v)
        elif k == "tolerances":
            for name, value in dict(v).items():
                if name not in ("out_abs", "lse_abs", "logprob_abs"):
                    raise TypeError(f"options.tolerances: unknown key {name!r}")
                setattr(out.tolerances, name, float(value))
        elif k == "cp_strategy":
            out.cp_strategy = E.parse_enum(report_pb2.CpStrategy, "CP_STRATEGY_", v,
                                           "options.cp_strategy")
        elif k in ("include_merge_orders", "compute_kv_fingerprint"):
            setattr(out, k, bool(v))
        elif k == "worst_heads":
            out.worst_heads = int(v)
        else:
            raise TypeError(f"options: unknown key {k!r}")
    return out


def priority(value: Any) -> int:
    if value is None:
        return service_pb2.PRIORITY_UNSPECIFIED
    return E.parse_enum(service_pb2.Priority, "PRIORITY_", value, "priority")


def _rest(message: Any) -> bytes:
    return message.SerializeToString()


def audit_request(snapshot: Snapshot, options: Any, prio: int) -> bytes:
    rest = service_pb2.AuditRequest(priority=E.wire(prio))
    if options is not None:
        rest.options.CopyFrom(options)
    return _wire.request_bytes(1, snapshot.pieces(), _rest(rest))


def memfd_audit_request(memfd: Any, options: Any, prio: int) -> bytes:
    """An AuditRequest naming `memfd` (a MemfdSnapshot) instead of carrying
    the snapshot."""
    request = service_pb2.AuditRequest(priority=E.wire(prio),
                                       snapshot_memfd=memfd.describe())
    if options is not None:
        request.options.CopyFrom(options)
    return request.SerializeToString()


def submit_request(snapshot: Snapshot, options: Any, prio: int,
                   idempotency_key: Optional[str], job_timeout: Optional[float]) -> bytes:
    rest = service_pb2.SubmitRequest(priority=E.wire(prio),
                                     idempotency_key=idempotency_key or "")
    if options is not None:
        rest.options.CopyFrom(options)
    if job_timeout is not None:
        rest.timeout.FromNanoseconds(int(job_timeout * 1e9))
    return _wire.request_bytes(1, snapshot.pieces(), _rest(rest))


def request_size(snapshot: Snapshot) -> int:
    return snapshot.nbytes + REQUEST_OVERHEAD


def stream_threshold(caps: Optional[service_pb2.Capabilities],
                     override: Optional[int]) -> int:
    if override:
        return int(override)
    limit = FALLBACK_RECEIVE_LIMIT
    if caps is not None and caps.limits.max_receive_message_bytes > 0:
        limit = caps.limits.max_receive_message_bytes
    return min(limit // 4 * 3, STREAM_ABOVE)


def chunk_size(caps: Optional[service_pb2.Capabilities], override: Optional[int]) -> int:
    """The AuditStream chunk size: the override, else the server's
    recommendation, never more than half its receive limit (every chunk is
    one message the server must accept)."""
    if override:
        return int(override)
    chunk = DEFAULT_CHUNK
    if caps is not None and caps.limits.recommended_chunk_bytes > 0:
        chunk = int(caps.limits.recommended_chunk_bytes)
    if caps is not None and caps.limits.max_receive_message_bytes > 0:
        chunk = min(chunk, max(MIN_CHUNK, caps.limits.max_receive_message_bytes // 2))
    return chunk


def stream_messages(snapshot: Snapshot, options: Any, prio: int, chunk: int,
                    min_streamed: int = MIN_STREAMED) -> Iterator[bytes]:
    """The AuditStream messages: the header, then the chunks (a generator,
    so chunks are encoded as gRPC sends them)."""
    snapshot.wait()
    tensors = {p: snapshot.wire_tensor(p) for p in snapshot.tensor_paths()}
    # Small tensors ride inline in the header, smallest first, while the
    # header stays well under a chunk (so under the server's limit too).
    inline, budget = set(), chunk // 2
    for p in sorted(tensors, key=lambda p: tensors[p].nbytes):
        n = tensors[p].nbytes
        if n >= min_streamed or n > budget:
            break
        inline.add(p)
        budget -= n
    streamed = [p for p in _wire.TENSOR_PATHS if p in tensors and p not in inline]
    yield _wire.header_message(snapshot.meta, tensors, streamed, options, prio)
    yield from _wire.chunk_messages(tensors, streamed, chunk)


def choose_transport(transport: str, snapshot: Snapshot, threshold: int) -> str:
    if transport not in ("auto", "unary", "stream"):
        raise ValueError(
            f"transport: {transport!r}; expected auto, unary, stream or memfd")
    if transport != "auto":
        return transport
    return "stream" if request_size(snapshot) > threshold else "unary"


def watch_request(model: Optional[str], layer: Optional[int], engine: Optional[str],
                  backend: Optional[str], verdicts: Optional[Sequence],
                  resume_after: Optional[int] = None) -> bytes:
    f = service_pb2.ResultFilter(model=model or "", engine=engine or "",
                                 backend=backend or "")
    if layer is not None:
        f.layer = int(layer)
    for v in verdicts or ():
        f.verdicts.append(E.parse_enum(report_pb2.Verdict, "VERDICT_", v, "verdicts"))
    request = service_pb2.WatchResultsRequest(filter=f)
    if resume_after is not None:
        if isinstance(resume_after, bool) or int(resume_after) < 0:
            raise ValueError(f"resume_after: must be a cursor >= 0, got {resume_after!r}")
        request.resume_after = int(resume_after)
    return request.SerializeToString()


MAX_PAGE_SIZE = 1000


def _instant(value: Any, what: str) -> Optional[datetime.datetime]:
    """A point in time from None, seconds ago (a number), a timedelta (that
    long ago) or a datetime (naive ones are local time, as
    datetime.timestamp() reads them)."""
    if value is None:
        return None
    if isinstance(value, datetime.datetime):
        return value if value.tzinfo else value.astimezone()
    now = datetime.datetime.fromtimestamp(time.time(), datetime.timezone.utc)
    if isinstance(value, datetime.timedelta):
        return now - value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return now - datetime.timedelta(seconds=float(value))
    raise TypeError(f"{what}: expected seconds ago, a timedelta or a datetime, "
                    f"got {type(value).__name__}")


def list_request(*, model: Optional[str] = None, layer: Optional[int] = None,
                 engine: Optional[str] = None, backend: Optional[str] = None,
                 verdict: Any = None, diagnosis: Optional[str] = None,
                 step: Optional[int] = None, run: Optional[str] = None,
                 state: Any = None, since: Any = None, until: Any = None,
                 page_size: int = 100) -> service_pb2.ListResultsRequest:
    """The first page's ListResultsRequest (page_token empty)."""
    if isinstance(page_size, bool) or not 1 <= int(page_size) <= MAX_PAGE_SIZE:
        raise ValueError(f"page_size: must be in [1, {MAX_PAGE_SIZE}], got {page_size!r}")
    r = service_pb2.ListResultsRequest(
        model=model or "", engine=engine or "", backend=backend or "",
        diagnosis=diagnosis or "", run=run or "", page_size=int(page_size))
    if layer is not None:
        r.layer = int(layer)
    if step is not None:
        r.step = int(step)
    if verdict is not None:
        r.verdict = E.parse_enum(report_pb2.Verdict, "VERDICT_", verdict, "verdict")
    if state is not None:
        r.state = E.parse_enum(service_pb2.JobState, "JOB_STATE_", state, "state")
    for field, value, what in (("finished_after", since, "since"),
                               ("finished_before", until, "until")):
        instant = _instant(value, what)
        if instant is not None:
            getattr(r, field).FromDatetime(instant.astimezone(datetime.timezone.utc))
    return r


def pairs_request(*, run: Optional[str] = None, layer: Optional[int] = None,
                  verdict: Any = None, step: Optional[int] = None,
                  request_id: Optional[str] = None, since: Any = None, until: Any = None,
                  page_size: int = 100) -> service_pb2.ListPairsRequest:
    """The first page's ListPairsRequest (page_token empty)."""
    if isinstance(page_size, bool) or not 1 <= int(page_size) <= MAX_PAGE_SIZE:
        raise ValueError(f"page_size: must be in [1, {MAX_PAGE_SIZE}], got {page_size!r}")
    r = service_pb2.ListPairsRequest(run=run or "", request_id=request_id or "",
                                     page_size=int(page_size))
    if layer is not None:
        r.layer = int(layer)
    if step is not None:
        r.step = int(step)
    if verdict is not None:
        r.verdict = E.wire(verdict_number(verdict))
    for field, value, what in (("joined_after", since, "since"),
                               ("joined_before", until, "until")):
        instant = _instant(value, what)
        if instant is not None:
            getattr(r, field).FromDatetime(instant.astimezone(datetime.timezone.utc))
    return r


def id_request(cls: Any, job_id: str) -> bytes:
    if not isinstance(job_id, str) or not job_id:
        raise ValueError("job_id: must be a non-empty string")
    return cls(job_id=job_id).SerializeToString()
