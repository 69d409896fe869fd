"""Typed exceptions for gRPC errors of attnaudit-server.

Every failed call raises an AuditError subclass chosen by the gRPC status
code, carrying:
  code         the grpc.StatusCode
  message      the server's message, unchanged
  field_path   the field the server named, e.g. "snapshot.block_table[1][3]"
               for INVALID_ARGUMENT answers (their messages start with
               "<field path>: "); None when the message names no field
  retry_after  seconds the server suggests waiting (the "retry-after-ms"
               trailer of RESOURCE_EXHAUSTED and some UNAVAILABLE answers,
               else a positive "grpc-retry-pushback-ms"), else None

The clients have already retried what gRPC's retry policy covers
(_calls.RETRY_SERVICE_CONFIG) before one of these is raised.
"""

from __future__ import annotations

import re
from typing import Any, Optional

import grpc

# A field path: identifiers joined by "." with optional [index] parts,
# followed by ": " (e.g. "snapshot.k_pages[3][0][1][7]: value is not finite").
_FIELD_PATH = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*(?:\[-?\d+\])*"
                         r"(?:\.[A-Za-z_][A-Za-z0-9_]*(?:\[-?\d+\])*)*"
                         r"(?:, [A-Za-z_][A-Za-z0-9_.\[\]]*)*): ")


def field_path_of(message: str) -> Optional[str]:
    """The field path a server message starts with, or None."""
    m = _FIELD_PATH.match(message or "")
    return m.group(1) if m else None


class AuditError(Exception):
    """A call to attnaudit-server failed."""

    def __init__(self, code: grpc.StatusCode, message: str,
                 retry_after: Optional[float] = None):
        self.code = code
        self.message = message
        self.field_path = field_path_of(message)
        self.retry_after = retry_after
        super().__init__(f"{code.name}: {message}")


class InvalidArgumentError(AuditError, ValueError):
    """The snapshot or request is malformed; field_path names the field."""


class ResourceExhaustedError(AuditError):
    """Admission control refused the request (queue or budget full, or the
    message over the receive limit); retry after `retry_after` seconds."""


class DeadlineExceededError(AuditError, TimeoutError):
    """The call's deadline (or the job's timeout) passed first."""


class CancelledError(AuditError):
    """The call or job was cancelled."""


class NotFoundError(AuditError, LookupError):
    """Unknown job id."""


class UnavailableError(AuditError, ConnectionError):
    """The server is unreachable or draining."""


class UnauthenticatedError(AuditError, PermissionError):
    """Missing or wrong bearer token."""


class PermissionDeniedError(AuditError, PermissionError):
    """The server refused the caller."""


_BY_CODE = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceededError,
    grpc.StatusCode.CANCELLED: CancelledError,
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.UNAUTHENTICATED: UnauthenticatedError,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDeniedError,
}


def _retry_after(metadata: Any) -> Optional[float]:
    found = dict(metadata or ())
    for key in ("retry-after-ms", "grpc-retry-pushback-ms"):
        if key in found:
            try:
                ms = int(found[key])
            except (TypeError, ValueError):
                return None
            # A negative pushback means "do not retry": no hint.
            return ms / 1000.0 if ms >= 0 else None
    return None


def from_rpc_error(error: grpc.RpcError) -> AuditError:
    """The typed exception for a grpc.RpcError (sync or asyncio)."""
    code = error.code() if callable(getattr(error, "code", None)) else grpc.StatusCode.UNKNOWN
    details = error.details() if callable(getattr(error, "details", None)) else str(error)
    try:
        trailers = error.trailing_metadata()
    except Exception:  # noqa: BLE001 - not every RpcError carries trailers
        trailers = None
    cls = _BY_CODE.get(code, AuditError)
    message = details or ""
    if code == grpc.StatusCode.UNAVAILABLE:
        message += _transport_hint(message)
    return cls(code, message, _retry_after(trailers))


# What a connection failure suggests about TLS, by gRPC's wording (OpenSSL's
# "wrong version number" or BoringSSL's WRONG_VERSION_NUMBER alike): a TLS
# server closes a plaintext client's connection at its first bytes; a
# plaintext server answers a TLS hello with no TLS record.
_TRANSPORT_HINTS = (
    ("socket closed", " (hint: if the server serves TLS, pass tls=True or "
     "tls={'ca': 'ca.pem'})"),
    ("wrong version number", " (hint: the server does not speak TLS: leave tls out)"),
    ("certificate verify failed", " (hint: the server's certificate is not signed by "
     "a CA this client trusts: tls={'ca': 'ca.pem'})"),
)


def _transport_hint(message: str) -> str:
    lowered = message.lower().replace("_", " ")
    return next((hint for text, hint in _TRANSPORT_HINTS if text in lowered), "")


def job_error(code: int, message: str) -> AuditError:
    """The typed exception for a JobResult.error (a code number)."""
    status = next((s for s in grpc.StatusCode if s.value[0] == code),
                  grpc.StatusCode.UNKNOWN)
    return _BY_CODE.get(status, AuditError)(status, message)
