// The CPU context-parallel (CP) replay: runs a CpSchedule
// (core/cp/schedule) over a CpTransport (core/cp/transport), with W ranks,
// and returns the P unit states the ranks computed, plus the combines that
// turn them into results (combine.h).
//
// Each rank only reads what it holds: in round 0 it gathers a chunk of its
// own shard from the pool into its slot (the "local fill"), in later ring
// rounds it works on the chunk it received; the unit kernel
// (ComputeRunStates) runs on that buffer. The states do not depend on
// which rank computed a unit, in which round or on which thread, so the
// deterministic combine rebuilds P bit for bit (docs/NUMERICS.md,
// "Context parallelism").
//
// Execution. kThreadPerRank: one thread per rank, each running its steps as
// fast as its transport waits allow (the real asynchronous protocol, W
// threads). kLockstep: ranks in turns -- every step is one parallel loop
// over the ranks on a bounded pool of threads (a rank's step depends only
// on the previous step's sends and grants), one barrier per step, so W may
// exceed the threads (a gang smaller than the world size). kAuto: thread
// per rank for a ring whose W ranks all have a worker (W <= workers),
// lockstep otherwise (partials never wait on each other).
//
// Thread safety: RunCpReplay may be called concurrently on a const
// PreparedAttention; a caller-supplied transport serves one call at a time.
// Errors: Cancelled when options.cancelled is set (checked every step),
// InvalidArgument when a K/V value is not finite, ResourceExhausted when
// the ring's buffers would exceed options.max_buffer_bytes, Internal for a
// transport protocol violation. A failing rank aborts the transport, so no
// rank is left waiting.
#ifndef ATTNAUDIT_CORE_CP_REPLAY_REPLAY_H_
#define ATTNAUDIT_CORE_CP_REPLAY_REPLAY_H_

#include <atomic>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "core/attention/attention.h"
#include "core/attention/unit_states.h"
#include "core/cp/schedule/schedule.h"
#include "core/cp/transport/transport.h"

namespace attnaudit {

enum class CpExecution : int { kAuto = 0, kLockstep = 1, kThreadPerRank = 2 };

// "lockstep" / "thread_per_rank" ("auto" for kAuto).
const char* CpExecutionName(CpExecution execution);

struct CpReplayOptions {
  int threads = 0;  // threads in all; 0: hardware concurrency
  int workers = 0;  // ranks that may run at once (a gang's size); 0: threads
  CpExecution execution = CpExecution::kAuto;
  // Null: an InProcessTransport sized for the schedule, owned by the call.
  // Otherwise it must have W = schedule.world() and slots of at least
  // CpSlotBytes(prepared, schedule) bytes, and be fresh: a transport
  // serves one replay (core/cp/transport/ring_protocol.h).
  CpTransport* transport = nullptr;
  int64_t max_buffer_bytes = int64_t{1} << 30;
  const std::atomic<bool>* cancelled = nullptr;
};

struct CpReplayRun {
  UnitStates states;  // P states of every unit (no R states)
  CpExecution execution = CpExecution::kAuto;  // what ran
  int64_t steps = 0;
  int64_t rounds = 0;
  int64_t passes = 0;
  // Per rank: seconds spent computing, and waiting on or copying through
  // the transport (fills included).
  std::vector<double> rank_compute_seconds;
  std::vector<double> rank_transport_seconds;
  double seconds = 0;  // wall clock of the whole replay
};

// Bytes one token takes in a step message: its position, K and V rows.
int64_t CpTokenBytes(const PreparedAttention& prepared);
// The slot size a transport needs for `schedule`.
int64_t CpSlotBytes(const PreparedAttention& prepared,
                    const CpSchedule& schedule);

absl::StatusOr<CpReplayRun> RunCpReplay(const PreparedAttention& prepared,
                                        const CpSchedule& schedule,
                                        const CpReplayOptions& options);

}  // namespace attnaudit

#endif  // ATTNAUDIT_CORE_CP_REPLAY_REPLAY_H_
