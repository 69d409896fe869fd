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
from typing import List, Optional

from attnaudit.v1 import report_pb2, service_pb2

from ._enums import Comparison, JobState, Priority, Verdict
from ._records import record, timestamp
from .errors import AuditError, job_error


_time = timestamp


class ComparisonView:
    """One comparison (candidate vs baseline) of a report."""

    __slots__ = ("proto",)

    def __init__(self, proto: report_pb2.ComparisonResult):
        self.proto = proto

    @property
    def comparison(self) -> Comparison:
        return Comparison(self.proto.comparison)

    @property
    def verdict(self) -> Verdict:
        return Verdict(self.proto.verdict)

    def _stats(self, name: str) -> Optional[report_pb2.DriftStats]:
        return getattr(self.proto, name) if self.proto.HasField(name) else None

    @property
    def out(self) -> Optional[report_pb2.DriftStats]:
        """Attention output drift (max_abs, max_rel, p99_abs, max_ulp, ...)."""
        return self._stats("out")

    @property
    def lse(self) -> Optional[report_pb2.DriftStats]:
        """LSE drift, natural log."""
        return self._stats("lse")

    @property
    def logprob(self) -> Optional[report_pb2.DriftStats]:
        """Selected-token log-prob drift, nats."""
        return self._stats("logprob")

    @property
    def logprob_agreement(self) -> Optional[report_pb2.LogprobAgreement]:
        """Log-prob agreement in RL terms (k1/k3 KL, importance ratios)."""
        return self._stats("logprob_agreement")

    @property
    def worst_heads(self) -> List[report_pb2.HeadSummary]:
        return list(self.proto.worst_heads)

    @property
    def reasons(self) -> List[str]:
        return list(self.proto.reasons)

    def __repr__(self) -> str:
        parts = [f"{self.comparison.name} {self.verdict.name}"]
        for name in ("out", "lse", "logprob"):
            s = self._stats(name)
            if s is not None:
                parts.append(f"{name}.max_abs={s.max_abs:.3g}/tol {s.tolerance:.3g}")
        return "<" + " ".join(parts) + ">"


class Diagnosis:
    """One hypothesis that explains a drift (docs/DIAGNOSIS.md)."""

    __slots__ = ("proto",)

    def __init__(self, proto: report_pb2.Diagnosis):
        self.proto = proto

    @property
    def hypothesis(self) -> str:
        """A bounded name: "stale-page", "rope-offset", "unexplained", ..."""
        return self.proto.hypothesis

    @property
    def detail(self) -> str:
        return self.proto.detail

    @property
    def score(self) -> float:
        """Share of the excess drift it removes, 0 to 1."""
        return self.proto.score

    @property
    def explains(self) -> bool:
        """Whether what is left is within a correct engine's noise."""
        return self.proto.explains

    @property
    def summary(self) -> str:
        return self.proto.summary

    @property
    def location(self) -> report_pb2.DiagnosisLocation:
        """Row, query, heads, logical block, page (the engine's id), the
        other block/page, CP rank; -1 / empty where it does not apply."""
        return self.proto.location

    @property
    def page(self) -> Optional[int]:
        p = self.proto.location.page
        return None if p < 0 or not self.proto.HasField("location") else p

    @property
    def row(self) -> Optional[int]:
        r = self.proto.location.row
        return None if r < 0 or not self.proto.HasField("location") else r

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

    @property
    def verdict(self) -> Verdict:
        return Verdict(self.proto.verdict)

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
    def invalid_reason(self) -> str:
        return self.proto.invalid_reason

    @property
    def inconclusive_reasons(self) -> List[str]:
        return list(self.proto.inconclusive_reasons)

    @property
    def overrides(self) -> List[str]:
        """The request's departures from the verdict policy (tolerance
        overrides, the statistical test off, precision fields past every
        profile's range), one line each; empty for a policy audit."""
        return list(self.proto.overrides)

    @property
    def overridden(self) -> bool:
        return len(self.proto.overrides) > 0

    @property
    def hull(self) -> report_pb2.HullCheck:
        """The engine output against the convex hull of its visible V rows
        (outside > 0 means DRIFT whatever the tolerances)."""
        return self.proto.hull

    @property
    def precision_source(self) -> str:
        """Where the engine's declared arithmetic came from: "measured",
        "preset", "declared" or "undeclared"."""
        return self.proto.provenance.precision_source

    @property
    def sensitivity(self) -> List[str]:
        """What the audit could not see and what would let it, one line
        each (an undeclared engine, a pre-RoPE snapshot without the
        engine's RoPE table)."""
        return list(self.proto.provenance.sensitivity)

    def comparison(self, which) -> Optional[ComparisonView]:
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
    def diagnoses(self) -> List["Diagnosis"]:
        """On DRIFT: the hypotheses that explain it, best first."""
        return [Diagnosis(d) for d in self.proto.diagnoses]

    @property
    def diagnosis(self) -> Optional["Diagnosis"]:
        """The top diagnosis, or None (no DRIFT, or the diagnosis was off)."""
        return Diagnosis(self.proto.diagnoses[0]) if self.proto.diagnoses else None

    @property
    def rope_checks(self) -> List[report_pb2.RopeCheck]:
        """The rolling RoPE check ("q", "k") and the RoPE table check
        ("table"), when the snapshot carried their inputs."""
        return list(self.proto.rope_checks)

    @property
    def engine_profile(self) -> str:
        """The engine precision profile the tolerances used."""
        return self.proto.provenance.engine_profile

    @property
    def dims(self) -> report_pb2.SnapshotDims:
        return self.proto.dims

    @property
    def labels(self):
        return self.proto.labels

    @property
    def provenance(self) -> report_pb2.Provenance:
        return self.proto.provenance

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

    @property
    def job_id(self) -> str:
        return self.proto.job_id

    @property
    def state(self) -> JobState:
        return JobState(self.proto.state)

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

    @property
    def error(self) -> Optional[AuditError]:
        """Why a FAILED or CANCELLED job has no report, as a typed error."""
        if not self.proto.HasField("error"):
            return None
        return job_error(self.proto.error.code, self.proto.error.message)

    @property
    def priority(self) -> Priority:
        return Priority(self.proto.priority)

    @property
    def labels(self):
        """The snapshot's attnaudit.v1.Labels (model, layer, engine,
        backend, step, run, request_ids)."""
        return self.proto.labels

    @property
    def run(self) -> str:
        """The rollout or training run label ("" when unset)."""
        return self.proto.labels.run

    @property
    def cursor(self) -> int:
        """The result's place in the store's result feed (1, 2, ... in
        commit order across every replica sharing the store); 0 while the
        job is unfinished or when the result was not stored. Pass the last
        one seen as watch(resume_after=...) to continue from there."""
        return self.proto.cursor

    @property
    def replica(self) -> str:
        """The replica that accepted (or took over) the job; "" when the
        result was not stored."""
        return self.proto.replica

    @property
    def submit_time(self) -> Optional[datetime.datetime]:
        return _time(self.proto, "submit_time")

    @property
    def start_time(self) -> Optional[datetime.datetime]:
        return _time(self.proto, "start_time")

    @property
    def finish_time(self) -> Optional[datetime.datetime]:
        return _time(self.proto, "finish_time")

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

    @property
    def job_id(self) -> str:
        return self.proto.job_id

    @property
    def state(self) -> JobState:
        """DONE, FAILED or CANCELLED."""
        return JobState(self.proto.state)

    @property
    def verdict(self) -> Optional[Verdict]:
        """The report's verdict of a DONE job, else None."""
        v = self.proto.verdict
        return Verdict(v) if v != report_pb2.VERDICT_UNSPECIFIED else None

    @property
    def labels(self):
        """The snapshot's attnaudit.v1.Labels (without request_ids)."""
        return self.proto.labels

    @property
    def model(self) -> str:
        return self.proto.labels.model

    @property
    def layer(self) -> Optional[int]:
        return self.proto.labels.layer if self.proto.labels.HasField("layer") else None

    @property
    def engine(self) -> str:
        return self.proto.labels.engine

    @property
    def backend(self) -> str:
        return self.proto.labels.backend

    @property
    def step(self) -> Optional[int]:
        return self.proto.labels.step if self.proto.labels.HasField("step") else None

    @property
    def run(self) -> str:
        return self.proto.labels.run

    def _brief(self, name: str) -> Optional[service_pb2.DriftBrief]:
        return getattr(self.proto, name) if self.proto.HasField(name) else None

    @property
    def engine_out(self) -> Optional[service_pb2.DriftBrief]:
        """Engine vs reference, attention output: max_abs, rms, tolerance."""
        return self._brief("engine_out")

    @property
    def engine_lse(self) -> Optional[service_pb2.DriftBrief]:
        """Engine vs reference, LSE (natural log)."""
        return self._brief("engine_lse")

    @property
    def replay_out(self) -> Optional[service_pb2.DriftBrief]:
        """Replay vs reference, attention output."""
        return self._brief("replay_out")

    @property
    def replay_lse(self) -> Optional[service_pb2.DriftBrief]:
        """Replay vs reference, LSE."""
        return self._brief("replay_lse")

    @property
    def logprob_max_abs(self) -> float:
        """Engine vs reference selected-token log-prob drift, nats (0 when
        the snapshot carried no log-probs)."""
        return self.proto.logprob_max_abs

    @property
    def diagnosis(self) -> Optional[str]:
        """The top diagnosis hypothesis of a DRIFT ("stale-page", ...), or
        None."""
        return self.proto.diagnosis or None

    @property
    def diagnosis_summary(self) -> str:
        return self.proto.diagnosis_summary

    @property
    def diagnosis_location(self) -> Optional[report_pb2.DiagnosisLocation]:
        return (self.proto.diagnosis_location
                if self.proto.HasField("diagnosis_location") else None)

    @property
    def replica(self) -> str:
        """The replica that accepted the job."""
        return self.proto.replica

    @property
    def cursor(self) -> int:
        """The result's place in the store's result feed (see
        JobResult.cursor)."""
        return self.proto.cursor

    @property
    def submit_time(self) -> Optional[datetime.datetime]:
        return _time(self.proto, "submit_time")

    @property
    def start_time(self) -> Optional[datetime.datetime]:
        return _time(self.proto, "start_time")

    @property
    def finish_time(self) -> Optional[datetime.datetime]:
        return _time(self.proto, "finish_time")

    @property
    def error(self) -> Optional[AuditError]:
        """Why a FAILED or CANCELLED job has no report, as a typed error."""
        if not self.proto.HasField("error"):
            return None
        return job_error(self.proto.error.code, self.proto.error.message)

    @property
    def audit_seconds(self) -> float:
        """The audit's own time (the report's total stage time)."""
        return self.proto.audit_seconds

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
