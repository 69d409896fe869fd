"""attnaudit: Python client for attnaudit-server.

    import attnaudit
    client = attnaudit.AuditClient("localhost:50051")
    snap = attnaudit.Snapshot.from_paged_kv(q, kv_cache, None, block_table,
                                            seq_lens, layout="vllm",
                                            engine_out=out, engine_lse=lse,
                                            lse_base="e")
    report = client.audit(snap)
    print(report.verdict, report.engine_vs_reference.out.max_abs)
    df = client.list_results(run="grpo-7", since=3600).to_pandas()
    for pair in client.list_pairs(run="grpo-7"):   # train-rollout pairs
        print(pair.layer, pair.verdict, pair.rollout_job_id, pair.trainer_job_id)

docs/PYTHON.md in the repository is the guide. attnaudit.aio has the
asyncio client; attnaudit.v1 the generated protobuf/gRPC stubs.
"""

from ._version import __version__
from ._calls import Submitted, Tls
from ._enums import Comparison, JobState, Priority, Verdict
from .auditor import AuditorCounters, AuditResult, RolloutAuditor
from .client import AuditClient, Watch
from .memfd import MemfdSnapshot
from .errors import (AuditError, CancelledError, DeadlineExceededError,
                     InvalidArgumentError, NotFoundError, PermissionDeniedError,
                     ResourceExhaustedError, UnauthenticatedError, UnavailableError)
from ._pair_views import PairResult
from .report import ComparisonView, Diagnosis, JobResult, Report, ResultSummary
from .results import (PairIterator, ResultIterator, pairs_to_pandas, results_to_pandas,
                      results_to_parquet)
from .snapshot import ENGINE_PRESETS, HF_FAMILY_CAST_POINTS, Snapshot

__all__ = [
    "AuditClient", "AuditError", "AuditResult", "AuditorCounters", "CancelledError",
    "Comparison", "ComparisonView", "DeadlineExceededError", "Diagnosis", "InvalidArgumentError",
    "JobResult", "JobState", "MemfdSnapshot", "NotFoundError", "PairIterator", "PairResult",
    "PermissionDeniedError", "Priority",
    "ENGINE_PRESETS", "HF_FAMILY_CAST_POINTS", "Report", "ResourceExhaustedError",
    "ResultIterator", "ResultSummary",
    "RolloutAuditor", "Snapshot", "Submitted", "Tls", "UnauthenticatedError", "UnavailableError",
    "Verdict", "Watch", "__version__", "pairs_to_pandas", "results_to_pandas",
    "results_to_parquet",
]
