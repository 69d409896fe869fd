"""The rows of train-rollout pairs and the pairs the server joined, as
values: RowPair and PairReport (what attnaudit.pairs.compare() returns, and
what a PairReport message reads as), and the PairResult view of a ListPairs
row. Messages in, plain values out; no arrays, no I/O (attnaudit.pairs has
the comparison, and re-exports these names).
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any, Dict, List, Optional, Tuple

from ._enums import Verdict
from ._records import timestamp
from .v1 import report_pb2, service_pb2

# Each side's q, K and V come from a projection rounded once to their dtype
# (0.5 ulp) and a RoPE of up to three rounded ops (bf16 engines: 1.5 ulps):
# two correct sides fed the same hidden state differ by at most 3 ulps.
INPUT_ROUNDING_ULPS = 3.0

PAIR_VERDICTS = ("consistent", "within-noise", "inputs-differ", "stale-prefix-kv",
                 "rollout-drift",
                 "trainer-drift", "both-drift")


@dataclasses.dataclass(frozen=True)
class RowPair:
    """One (request id, position) both snapshots hold.

    out_*: trainer output vs rollout output; q_ulps / kv_ulps: the largest
    input difference in ulps of its dtype (kv over the common prefix of
    keys_compared keys; newest_kv_ulps over its last key, the one made in
    the same forward as q); input_effect: max |diff| of the float64 outputs
    of the two inputs; noise: the tolerance it is judged against."""

    request_id: str
    position: int
    rollout_row: int
    trainer_row: int
    out_bitwise: bool
    out_max_abs: float
    out_max_ulps: float
    q_ulps: float
    kv_ulps: float
    newest_kv_ulps: float
    keys_compared: int
    input_effect: float
    noise: float
    verdict: str

    @property
    def inputs_differing(self) -> str:
        """"q and K/V", "q", "K/V" (those beyond rounding, else those not
        bitwise equal) or "" (bitwise equal inputs)."""
        both = (("q", self.q_ulps), ("K/V", self.kv_ulps))
        parts = [name for name, ulps in both if ulps > INPUT_ROUNDING_ULPS] or \
            [name for name, ulps in both if ulps]
        return " and ".join(parts)

    @classmethod
    def from_proto(cls, m: report_pb2.PairRow) -> "RowPair":
        """The row of a PairReport message (the server's, ListPairs)."""
        return cls(request_id=m.request_id, position=m.position,
                   rollout_row=m.rollout_row, trainer_row=m.trainer_row,
                   out_bitwise=m.out_bitwise, out_max_abs=m.out_max_abs,
                   out_max_ulps=m.out_max_ulps, q_ulps=m.q_ulps, kv_ulps=m.kv_ulps,
                   newest_kv_ulps=m.newest_kv_ulps, keys_compared=m.keys_compared,
                   input_effect=m.input_effect, noise=m.noise,
                   verdict=verdict_name(m.verdict) or "")


def verdict_name(number: int) -> Optional[str]:
    """A PairVerdict number as its name here ("within-noise"); None for
    PAIR_VERDICT_UNSPECIFIED (no common row)."""
    if number == report_pb2.PAIR_VERDICT_UNSPECIFIED:
        return None
    name = report_pb2.PairVerdict.Name(number)
    return name[len("PAIR_VERDICT_"):].lower().replace("_", "-")


def verdict_number(value: Any) -> int:
    """A pair verdict given as its name ("within-noise", "WITHIN_NOISE",
    "PAIR_VERDICT_WITHIN_NOISE") or number, as its PairVerdict number.
    ValueError naming the verdicts otherwise."""
    number: Optional[int] = None
    if isinstance(value, int) and not isinstance(value, bool):
        if value in report_pb2.PairVerdict.values() and value:
            number = value
    elif isinstance(value, str):
        name = value.strip().upper().replace("-", "_")
        for candidate in (name, "PAIR_VERDICT_" + name):
            if candidate in report_pb2.PairVerdict.keys():
                number = report_pb2.PairVerdict.Value(candidate)
                break
    if not number:
        raise ValueError(f"verdict: unknown pair verdict {value!r}; expected one of "
                         + ", ".join(PAIR_VERDICTS))
    return number


@dataclasses.dataclass(frozen=True)
class PairReport:
    """The pairs of one layer's two snapshots; verdict: the worst row's
    (in PAIR_VERDICTS order, later is worse)."""

    layer: Optional[int]
    rows: Tuple[RowPair, ...]
    rollout_verdict: Optional[Verdict]
    trainer_verdict: Optional[Verdict]
    rollout_diagnosis: Optional[str]
    trainer_diagnosis: Optional[str]
    unmatched_rollout: int
    unmatched_trainer: int

    @property
    def verdict(self) -> Optional[str]:
        if not self.rows:
            return None
        return max((r.verdict for r in self.rows), key=PAIR_VERDICTS.index)

    def line(self) -> str:
        """One line for a log: the verdict, the counts, the worst row."""
        if not self.rows:
            return (f"pair layer {self.layer}: no common (request, position) rows "
                    f"({self.unmatched_rollout} rollout, {self.unmatched_trainer} "
                    "trainer rows unmatched)")
        counts: Dict[str, int] = {}
        for r in self.rows:
            counts[r.verdict] = counts.get(r.verdict, 0) + 1
        worst = max(self.rows, key=lambda r: (PAIR_VERDICTS.index(r.verdict),
                                              r.out_max_abs))
        text = (f"pair layer {self.layer}: {self.verdict} ("
                + ", ".join(f"{v} {n}" for v, n in counts.items()) + "); worst "
                f"{worst.request_id}@{worst.position}: outputs differ by "
                f"{worst.out_max_abs:.3g} ({worst.out_max_ulps:.3g} ulps)")
        if worst.verdict in ("inputs-differ", "stale-prefix-kv"):
            text += (f", {worst.inputs_differing} differ (effect {worst.input_effect:.3g} "
                     f"> noise {worst.noise:.3g})")
        diagnosis = {"rollout-drift": self.rollout_diagnosis,
                     "trainer-drift": self.trainer_diagnosis}.get(worst.verdict)
        if diagnosis:
            text += f"; diagnosis {diagnosis}"
        return text

    @classmethod
    def from_proto(cls, m: report_pb2.PairReport) -> "PairReport":
        """A PairReport message (the server's, ListPairs) as this class."""
        return cls(
            layer=m.layer if m.HasField("layer") else None,
            rows=tuple(RowPair.from_proto(r) for r in m.rows),
            rollout_verdict=_report_verdict(m.rollout_verdict),
            trainer_verdict=_report_verdict(m.trainer_verdict),
            rollout_diagnosis=m.rollout_diagnosis or None,
            trainer_diagnosis=m.trainer_diagnosis or None,
            unmatched_rollout=m.unmatched_rollout, unmatched_trainer=m.unmatched_trainer)


def _report_verdict(number: int) -> Optional[Verdict]:
    return None if number == report_pb2.VERDICT_UNSPECIFIED else Verdict(number)


# The flat columns of PairIterator.to_records() / to_pandas(): one row per
# pair row, with its pair's fields.
PAIR_COLUMNS = ("join_time", "run", "layer", "rollout_step", "trainer_step",
                "rollout_weight_version", "trainer_weight_version", "pair_verdict",
                "rollout_verdict", "trainer_verdict", "request_id", "position", "verdict",
                "out_bitwise", "out_max_abs", "out_max_ulps", "q_ulps", "kv_ulps",
                "newest_kv_ulps", "keys_compared", "input_effect", "noise",
                "inputs_differing", "rollout_job_id", "trainer_job_id", "replica")


class PairResult:
    """One train-rollout pair the server joined (a ListPairs row): the two
    audited jobs (client.get(job_id) has each side's report), their run,
    layer, steps and weight versions, and the pair report, as compare()
    gives it."""

    __slots__ = ("proto", "_report")

    def __init__(self, proto: service_pb2.PairResult):
        self.proto = proto
        self._report: Optional[PairReport] = None

    @property
    def rollout_job_id(self) -> str:
        return self.proto.rollout_job_id

    @property
    def trainer_job_id(self) -> str:
        return self.proto.trainer_job_id

    @property
    def run(self) -> str:
        return self.proto.run

    @property
    def layer(self) -> Optional[int]:
        return self.proto.layer if self.proto.HasField("layer") else None

    @property
    def rollout_step(self) -> Optional[int]:
        """The rollout snapshot's step label; None when unlabelled."""
        p = self.proto
        return p.rollout_step if p.HasField("rollout_step") else None

    @property
    def trainer_step(self) -> Optional[int]:
        p = self.proto
        return p.trainer_step if p.HasField("trainer_step") else None

    @property
    def rollout_weight_version(self) -> str:
        """The rollout snapshot's weight_version label ("" when unknown)."""
        return self.proto.rollout_weight_version

    @property
    def trainer_weight_version(self) -> str:
        return self.proto.trainer_weight_version

    @property
    def weight_versions_differ(self) -> bool:
        """Both sides name a weight version, and not the same one."""
        r, t = self.rollout_weight_version, self.trainer_weight_version
        return bool(r and t and r != t)

    @property
    def report(self) -> PairReport:
        """The pair report (rows, each side's verdict and diagnosis)."""
        if self._report is None:
            self._report = PairReport.from_proto(self.proto.report)
        return self._report

    @property
    def verdict(self) -> Optional[str]:
        """The gravest row's verdict ("consistent", "within-noise", ...;
        PAIR_VERDICTS); None when no row is common."""
        return verdict_name(self.proto.report.verdict)

    @property
    def rows(self) -> Tuple[RowPair, ...]:
        return self.report.rows

    @property
    def rollout_verdict(self) -> Optional[Verdict]:
        return self.report.rollout_verdict

    @property
    def trainer_verdict(self) -> Optional[Verdict]:
        return self.report.trainer_verdict

    @property
    def rollout_diagnosis(self) -> Optional[str]:
        """The rollout's top diagnosis ("hypothesis: summary"), or None."""
        return self.report.rollout_diagnosis

    @property
    def trainer_diagnosis(self) -> Optional[str]:
        return self.report.trainer_diagnosis

    @property
    def join_time(self) -> Optional[datetime.datetime]:
        """When the server joined the pair (UTC)."""
        return timestamp(self.proto, "join_time")

    @property
    def replica(self) -> str:
        """The replica that joined the pair."""
        return self.proto.replica

    def line(self) -> str:
        """One line for a log (PairReport.line), with the run."""
        return f"{self.run or '-'} {self.report.line()}"

    def to_records(self) -> List[Dict[str, Any]]:
        """One flat dict per row, with the pair's fields (PAIR_COLUMNS)."""
        pair = {"join_time": self.join_time, "run": self.run or None,
                "layer": self.layer, "rollout_step": self.rollout_step,
                "trainer_step": self.trainer_step,
                "rollout_weight_version": self.rollout_weight_version or None,
                "trainer_weight_version": self.trainer_weight_version or None,
                "pair_verdict": self.verdict,
                "rollout_verdict": _name(self.rollout_verdict),
                "trainer_verdict": _name(self.trainer_verdict),
                "rollout_job_id": self.rollout_job_id, "trainer_job_id": self.trainer_job_id,
                "replica": self.replica or None}
        out = []
        for r in self.rows:
            record = dict(pair, **dataclasses.asdict(r), inputs_differing=r.inputs_differing)
            out.append({name: record[name] for name in PAIR_COLUMNS})
        return out

    def __repr__(self) -> str:
        parts = [self.verdict or "no-common-rows", f"run={self.run!r}",
                 f"layer={self.layer}", f"rows={len(self.proto.report.rows)}",
                 self.rollout_job_id, self.trainer_job_id]
        return "<attnaudit.PairResult " + " ".join(parts) + ">"


def _name(verdict: Optional[Verdict]) -> Optional[str]:
    return None if verdict is None else verdict.name
