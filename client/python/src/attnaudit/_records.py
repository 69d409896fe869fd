"""Flat rows of stored results: the ResultSummary a JobResult reduces to,
and the record (one dict, the keys of COLUMNS) a ResultSummary tabulates as.

Messages in, plain values out: the views of attnaudit.report and the tables
of attnaudit.results both build on this module, which imports neither.
"""

from __future__ import annotations

import datetime
from typing import Any, Dict, Optional

from attnaudit.v1 import report_pb2, service_pb2

from ._enums import JobState, Verdict

# The flat columns of results_to_pandas / results_to_parquet, in order.
COLUMNS = ("job_id", "state", "verdict", "model", "layer", "engine", "backend",
           "step", "run", "engine_out_max_abs", "engine_out_rms",
           "engine_lse_max_abs", "replay_out_max_abs", "logprob_max_abs",
           "diagnosis", "replica", "cursor", "submit_time", "finish_time",
           "audit_seconds", "error_code", "error_message")


def timestamp(message: Any, field: str) -> Optional[datetime.datetime]:
    """A Timestamp field as an aware UTC datetime, or None when unset."""
    if not message.HasField(field):
        return None
    value: datetime.datetime = getattr(message, field).ToDatetime(
        tzinfo=datetime.timezone.utc)
    return value


def summarize(result: service_pb2.JobResult) -> service_pb2.ResultSummary:
    """The ResultSummary of a full JobResult, computed as the server's
    ListResults computes it (so watched and listed results tabulate
    alike)."""
    s = service_pb2.ResultSummary(job_id=result.job_id, state=result.state,
                                  replica=result.replica, cursor=result.cursor)
    s.labels.CopyFrom(result.labels)
    s.labels.ClearField("request_ids")
    for field in ("submit_time", "start_time", "finish_time", "error"):
        if result.HasField(field):
            getattr(s, field).CopyFrom(getattr(result, field))
    if not result.HasField("report"):
        return s
    report = result.report
    s.verdict = report.verdict
    for c in report.comparisons:
        if c.comparison == report_pb2.COMPARISON_ENGINE_VS_REFERENCE:
            _brief(c.out, s.engine_out)
            _brief(c.lse, s.engine_lse)
            s.logprob_max_abs = c.logprob.max_abs
        elif c.comparison == report_pb2.COMPARISON_REPLAY_VS_REFERENCE:
            _brief(c.out, s.replay_out)
            _brief(c.lse, s.replay_lse)
    if report.diagnoses:
        top = report.diagnoses[0]
        s.diagnosis = top.hypothesis
        s.diagnosis_summary = top.summary
        s.diagnosis_location.CopyFrom(top.location)
    s.audit_seconds = report.provenance.timings.total_seconds
    return s


def _brief(stats: report_pb2.DriftStats, out: service_pb2.DriftBrief) -> None:
    out.max_abs, out.rms, out.tolerance = stats.max_abs, stats.rms, stats.tolerance


def record(p: service_pb2.ResultSummary) -> Dict[str, Any]:
    """A ResultSummary message as a flat dict with the keys of COLUMNS.
    Absent values are None: text left empty, a layer or step not labelled,
    a drift not compared, the error of a DONE job."""

    def brief(name: str, stat: str) -> Optional[float]:
        value: float = getattr(getattr(p, name), stat)
        return value if p.HasField(name) else None

    labels = p.labels
    return {
        "job_id": p.job_id or None,
        "state": JobState(p.state).name,
        "verdict": (Verdict(p.verdict).name
                    if p.verdict != report_pb2.VERDICT_UNSPECIFIED else None),
        "model": labels.model or None,
        "layer": labels.layer if labels.HasField("layer") else None,
        "engine": labels.engine or None,
        "backend": labels.backend or None,
        "step": labels.step if labels.HasField("step") else None,
        "run": labels.run or None,
        "engine_out_max_abs": brief("engine_out", "max_abs"),
        "engine_out_rms": brief("engine_out", "rms"),
        "engine_lse_max_abs": brief("engine_lse", "max_abs"),
        "replay_out_max_abs": brief("replay_out", "max_abs"),
        "logprob_max_abs": p.logprob_max_abs if p.HasField("engine_out") else None,
        "diagnosis": p.diagnosis or None,
        "replica": p.replica or None,
        "cursor": int(p.cursor),
        "submit_time": timestamp(p, "submit_time"),
        "finish_time": timestamp(p, "finish_time"),
        "audit_seconds": p.audit_seconds if p.state == service_pb2.JOB_STATE_DONE else None,
        "error_code": p.error.code if p.HasField("error") else None,
        "error_message": p.error.message if p.HasField("error") else None,
    }
