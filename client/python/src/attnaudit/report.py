"""Typed views of the server's answers.

Report wraps an attnaudit.v1.AuditReport: the generated message stays
available as `.proto`, and the common questions are attributes:

    report.verdict                                   Verdict.PASS / DRIFT
    report.engine_vs_reference.out.max_abs           DriftStats fields
    report.replay_vs_reference.lse.over_tolerance
    report.engine_vs_reference.logprob_agreement.k3_kl
    report.reasons                                   why it drifted
    report.diagnosis                                 the top Diagnosis, or None
    report.diagnoses                                 all, best first
    report.rope_checks                               the RoPE checks

A comparison that was not computed is None; a quantity it did not compare
(e.g. lse without an engine lse) is None too. JobResult wraps a
attnaudit.v1.JobResult the same way, and ResultSummary an
attnaudit.v1.ResultSummary (one row of ListResults). Views are immutable
snapshots of the message; they are cheap to create and safe to share
between threads. Times are timezone-aware datetimes in UTC, or None when
the server did not set them.
"""

from __future__ import annotations

import datetime
import operator
from typing import Any, Callable, List, Optional, Tuple, Union

from attnaudit.v1 import report_pb2, service_pb2, snapshot_pb2

from ._enums import Comparison, JobState, Priority, Verdict
from ._records import record, timestamp
from .errors import AuditError, job_error

# ---------------------------------------------------------------------------
# The attribute table: each view declares its attributes as one line each,
# `name: type = _kind("field.path", doc)`, read from the view's `proto`.
# ---------------------------------------------------------------------------


def _attribute(get: Callable[[Any], Any], doc: str) -> Any:
    """A read-only attribute computed from the view's message."""
    return property(lambda view: get(view.proto), doc=doc or None)


def _parent_and_name(path: str) -> Tuple[Callable[[Any], Any], str]:
    parent, _, name = path.rpartition(".")
    return (operator.attrgetter(parent) if parent else (lambda m: m)), name


def _field(path: str, doc: str = "") -> Any:
    """The field at `path` ("labels.run") as it is."""
    return _attribute(operator.attrgetter(path), doc)


def _optional(path: str, doc: str = "") -> Any:
    """The field at `path`, or None while it is unset (HasField)."""
    parent, name = _parent_and_name(path)

    def get(m: Any) -> Any:
        owner = parent(m)
        return getattr(owner, name) if owner.HasField(name) else None
    return _attribute(get, doc)


def _repeated(path: str, doc: str = "") -> Any:
    """The repeated field at `path` as a list."""
    get = operator.attrgetter(path)
    return _attribute(lambda m: list(get(m)), doc)


def _enum(path: str, cls: Callable[[int], Any], doc: str = "") -> Any:
    """The enum field at `path` as a member of `cls`."""
    get = operator.attrgetter(path)
    return _attribute(lambda m: cls(get(m)), doc)


def _time(path: str, doc: str = "") -> Any:
    """The Timestamp at `path` as an aware UTC datetime, or None when unset."""
    parent, name = _parent_and_name(path)
    return _attribute(lambda m: timestamp(parent(m), name), doc)


def _error(doc: str = "Why a FAILED or CANCELLED job has no report, as a typed error.") -> Any:
    """The job's `error` as a typed AuditError, or None when unset."""
    def get(m: Any) -> Optional[AuditError]:
        return job_error(m.error.code, m.error.message) if m.HasField("error") else None
    return _attribute(get, doc)


class ComparisonView:
    """One comparison (candidate vs baseline) of a report."""

    __slots__ = ("proto",)

    def __init__(self, proto: report_pb2.ComparisonResult):
        self.proto = proto

    comparison: Comparison = _enum("comparison", Comparison)
    verdict: Verdict = _enum("verdict", Verdict)
    out: Optional[report_pb2.DriftStats] = _optional(
        "out", "Attention output drift (max_abs, max_rel, p99_abs, max_ulp, ...).")
    lse: Optional[report_pb2.DriftStats] = _optional("lse", "LSE drift, natural log.")
    logprob: Optional[report_pb2.DriftStats] = _optional(
        "logprob", "Selected-token log-prob drift, nats.")
    logprob_agreement: Optional[report_pb2.LogprobAgreement] = _optional(
        "logprob_agreement", "Log-prob agreement in RL terms (k1/k3 KL, importance ratios).")
    worst_heads: List[report_pb2.HeadSummary] = _repeated("worst_heads")
    reasons: List[str] = _repeated("reasons")

    def __repr__(self) -> str:
        parts = [f"{self.comparison.name} {self.verdict.name}"]
        for name in ("out", "lse", "logprob"):
            if self.proto.HasField(name):
                s = getattr(self.proto, name)
                parts.append(f"{name}.max_abs={s.max_abs:.3g}/tol {s.tolerance:.3g}")
        return "<" + " ".join(parts) + ">"


class Diagnosis:
    """One hypothesis that explains a drift (docs/DIAGNOSIS.md)."""

    __slots__ = ("proto",)

    def __init__(self, proto: report_pb2.Diagnosis):
        self.proto = proto

    hypothesis: str = _field(
        "hypothesis", 'A bounded name: "stale-page", "rope-offset", "unexplained", ...')
    detail: str = _field("detail")
    score: float = _field("score", "Share of the excess drift it removes, 0 to 1.")
    explains: bool = _field("explains", "Whether what is left is within a correct engine's noise.")
    summary: str = _field("summary")
    location: report_pb2.DiagnosisLocation = _field(
        "location", "Row, query, heads, logical block, page (the engine's id), the "
        "other block/page, CP rank; -1 / empty where it does not apply.")

    def _located(self, value: int) -> Optional[int]:
        return None if value < 0 or not self.proto.HasField("location") else value

    @property
    def page(self) -> Optional[int]:
        return self._located(self.proto.location.page)

    @property
    def row(self) -> Optional[int]:
        return self._located(self.proto.location.row)

    def __repr__(self) -> str:
        where = []
        loc = self.proto.location
        if self.proto.HasField("location"):
            if loc.row >= 0:
                where.append(f"row={loc.row}")
            if loc.page >= 0:
                where.append(f"page={loc.page}")
            if loc.cp_rank >= 0:
                where.append(f"rank={loc.cp_rank}")
        return (f"<attnaudit.Diagnosis {self.hypothesis} {self.detail!r} "
                f"score={self.score:.2f}" + (" explains" if self.explains else "")
                + ("" if not where else " " + " ".join(where)) + ">")


class Report:
    """An audit report (see the module docstring)."""

    __slots__ = ("proto",)

    def __init__(self, proto: report_pb2.AuditReport):
        self.proto = proto

    verdict: Verdict = _enum("verdict", Verdict)
    invalid_reason: str = _field("invalid_reason")
    inconclusive_reasons: List[str] = _repeated("inconclusive_reasons")
    overrides: List[str] = _repeated(
        "overrides", "The request's departures from the verdict policy (tolerance "
        "overrides, the statistical test off, precision fields past every profile's "
        "range), one line each; empty for a policy audit.")
    hull: report_pb2.HullCheck = _field(
        "hull", "The engine output against the convex hull of its visible V rows "
        "(outside > 0 means DRIFT whatever the tolerances).")
    precision_source: str = _field(
        "provenance.precision_source", "Where the engine's declared arithmetic came "
        'from: "measured", "preset", "declared" or "undeclared".')
    sensitivity: List[str] = _repeated(
        "provenance.sensitivity", "What the audit could not see and what would let it, "
        "one line each (an undeclared engine, a pre-RoPE snapshot without the engine's "
        "RoPE table).")
    rope_checks: List[report_pb2.RopeCheck] = _repeated(
        "rope_checks", 'The rolling RoPE check ("q", "k") and the RoPE table check '
        '("table"), when the snapshot carried their inputs.')
    engine_profile: str = _field(
        "provenance.engine_profile", "The engine precision profile the tolerances used.")
    dims: report_pb2.SnapshotDims = _field("dims")
    labels: snapshot_pb2.Labels = _field("labels")
    provenance: report_pb2.Provenance = _field("provenance")

    @property
    def passed(self) -> bool:
        return self.proto.verdict == report_pb2.VERDICT_PASS

    @property
    def drifted(self) -> bool:
        return self.proto.verdict == report_pb2.VERDICT_DRIFT

    @property
    def inconclusive(self) -> bool:
        """Nothing drifted, but the audit could not verify what a PASS
        promises (inconclusive_reasons say why)."""
        return self.proto.verdict == report_pb2.VERDICT_INCONCLUSIVE

    @property
    def overridden(self) -> bool:
        return len(self.proto.overrides) > 0

    def comparison(self, which: Union[Comparison, int, str]) -> Optional[ComparisonView]:
        """The comparison `which` (a Comparison or its name), or None."""
        if isinstance(which, str):
            which = Comparison[which.upper()]
        for c in self.proto.comparisons:
            if c.comparison == int(which):
                return ComparisonView(c)
        return None

    @property
    def engine_vs_reference(self) -> Optional[ComparisonView]:
        """E vs R: engine drift, the production signal."""
        return self.comparison(Comparison.ENGINE_VS_REFERENCE)

    @property
    def replay_vs_reference(self) -> Optional[ComparisonView]:
        """P vs R: replay consistency."""
        return self.comparison(Comparison.REPLAY_VS_REFERENCE)

    @property
    def engine_vs_replay(self) -> Optional[ComparisonView]:
        """E vs P: kernel numerics vs cache/layout faults."""
        return self.comparison(Comparison.ENGINE_VS_REPLAY)

    @property
    def comparisons(self) -> List[ComparisonView]:
        return [ComparisonView(c) for c in self.proto.comparisons]

    @property
    def reasons(self) -> List[str]:
        """Every comparison's drift reasons, prefixed with its name."""
        return [f"{Comparison(c.comparison).name.lower()}: {r}"
                for c in self.proto.comparisons for r in c.reasons]

    @property
    def diagnoses(self) -> List[Diagnosis]:
        """On DRIFT: the hypotheses that explain it, best first."""
        return [Diagnosis(d) for d in self.proto.diagnoses]

    @property
    def diagnosis(self) -> Optional[Diagnosis]:
        """The top diagnosis, or None (no DRIFT, or the diagnosis was off)."""
        return Diagnosis(self.proto.diagnoses[0]) if self.proto.diagnoses else None

    def __repr__(self) -> str:
        d = self.proto.dims
        comps = ", ".join(repr(c) for c in self.comparisons)
        return (f"<attnaudit.Report {self.verdict.name} B={d.batch} Hq={d.q_heads} "
                f"pages={d.num_pages}x{d.page_size} [{comps}]>")


class JobResult:
    """State and outcome of a job (GetResult, WatchResults)."""

    __slots__ = ("proto",)

    def __init__(self, proto: service_pb2.JobResult):
        self.proto = proto

    job_id: str = _field("job_id")
    state: JobState = _enum("state", JobState)
    error: Optional[AuditError] = _error()
    priority: Priority = _enum("priority", Priority)
    labels: snapshot_pb2.Labels = _field(
        "labels", "The snapshot's attnaudit.v1.Labels (model, layer, engine, backend, "
        "step, run, request_ids).")
    run: str = _field("labels.run", 'The rollout or training run label ("" when unset).')
    cursor: int = _field(
        "cursor", "The result's place in the store's result feed (1, 2, ... in commit "
        "order across every replica sharing the store); 0 while the job is unfinished "
        "or when the result was not stored. Pass the last one seen as "
        "watch(resume_after=...) to continue from there.")
    replica: str = _field(
        "replica", 'The replica that accepted (or took over) the job; "" when the '
        "result was not stored.")
    submit_time: Optional[datetime.datetime] = _time("submit_time")
    start_time: Optional[datetime.datetime] = _time("start_time")
    finish_time: Optional[datetime.datetime] = _time("finish_time")

    @property
    def done(self) -> bool:
        """True once the job finished (DONE, FAILED or CANCELLED)."""
        return self.proto.state in (service_pb2.JOB_STATE_DONE,
                                    service_pb2.JOB_STATE_FAILED,
                                    service_pb2.JOB_STATE_CANCELLED)

    @property
    def report(self) -> Optional[Report]:
        """The report when DONE, else None."""
        if self.proto.state == service_pb2.JOB_STATE_DONE and self.proto.HasField("report"):
            return Report(self.proto.report)
        return None

    @property
    def verdict(self) -> Optional[Verdict]:
        r = self.report
        return r.verdict if r is not None else None

    def __repr__(self) -> str:
        v = self.verdict
        return (f"<attnaudit.JobResult {self.job_id} {self.state.name}"
                + (f" {v.name}" if v is not None else "")
                + (f" cursor={self.cursor}" if self.cursor else "") + ">")


class ResultSummary:
    """One stored result as ListResults returns it: state, verdict, labels,
    the headline drift numbers and the top diagnosis, without the full
    report (client.get(summary.job_id) has it)."""

    __slots__ = ("proto",)

    def __init__(self, proto: service_pb2.ResultSummary):
        self.proto = proto

    job_id: str = _field("job_id")
    state: JobState = _enum("state", JobState, "DONE, FAILED or CANCELLED.")
    labels: snapshot_pb2.Labels = _field(
        "labels", "The snapshot's attnaudit.v1.Labels (without request_ids).")
    model: str = _field("labels.model")
    layer: Optional[int] = _optional("labels.layer")
    engine: str = _field("labels.engine")
    backend: str = _field("labels.backend")
    step: Optional[int] = _optional("labels.step")
    run: str = _field("labels.run")
    engine_out: Optional[service_pb2.DriftBrief] = _optional(
        "engine_out", "Engine vs reference, attention output: max_abs, rms, tolerance.")
    engine_lse: Optional[service_pb2.DriftBrief] = _optional(
        "engine_lse", "Engine vs reference, LSE (natural log).")
    replay_out: Optional[service_pb2.DriftBrief] = _optional(
        "replay_out", "Replay vs reference, attention output.")
    replay_lse: Optional[service_pb2.DriftBrief] = _optional(
        "replay_lse", "Replay vs reference, LSE.")
    logprob_max_abs: float = _field(
        "logprob_max_abs", "Engine vs reference selected-token log-prob drift, nats "
        "(0 when the snapshot carried no log-probs).")
    diagnosis_summary: str = _field("diagnosis_summary")
    diagnosis_location: Optional[report_pb2.DiagnosisLocation] = _optional(
        "diagnosis_location")
    replica: str = _field("replica", "The replica that accepted the job.")
    cursor: int = _field(
        "cursor", "The result's place in the store's result feed (see JobResult.cursor).")
    submit_time: Optional[datetime.datetime] = _time("submit_time")
    start_time: Optional[datetime.datetime] = _time("start_time")
    finish_time: Optional[datetime.datetime] = _time("finish_time")
    error: Optional[AuditError] = _error()
    audit_seconds: float = _field(
        "audit_seconds", "The audit's own time (the report's total stage time).")

    @property
    def verdict(self) -> Optional[Verdict]:
        """The report's verdict of a DONE job, else None."""
        v = self.proto.verdict
        return Verdict(v) if v != report_pb2.VERDICT_UNSPECIFIED else None

    @property
    def diagnosis(self) -> Optional[str]:
        """The top diagnosis hypothesis of a DRIFT ("stale-page", ...), or
        None."""
        return self.proto.diagnosis or None

    def to_record(self) -> dict:
        """The flat row of results_to_pandas (attnaudit.results.COLUMNS)."""
        return record(self.proto)

    def __repr__(self) -> str:
        v = self.verdict
        parts = [self.job_id, self.state.name]
        if v is not None:
            parts.append(v.name)
        if self.engine_out is not None:
            parts.append(f"out.max_abs={self.engine_out.max_abs:.3g}")
        if self.diagnosis:
            parts.append(self.diagnosis)
        parts.append(f"cursor={self.cursor}")
        return "<attnaudit.ResultSummary " + " ".join(parts) + ">"
