#include "core/cp/replay/replay.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/common/parallel.h"
#include "core/cp/transport/in_process.h"

namespace attnaudit {
namespace {

using Clock = std::chrono::steady_clock;

// A step message: header words, one token count per row of the pass, then
// per row its positions (int64), K rows and V rows ([token][Hkv][D] in the
// prepared K/V dtypes), each row's block padded to 8 bytes.
struct Header {
  int64_t source;
  int64_t pass;
  int64_t chunk;
  int64_t rows;
};
constexpr int64_t kHeaderBytes = static_cast<int64_t>(sizeof(Header));

int64_t Pad8(int64_t x) { return (x + 7) / 8 * 8; }

int64_t ElemsPerToken(const PreparedAttention& p) {
  return p.dims.kv_heads * p.dims.head_dim;
}

// Byte offset of element (page, slot, head 0, d 0) or of (page, slot, g, 0)
// in a pool of `layout`.
int64_t PoolOffset(const PreparedAttention& p, KvLayout layout, int64_t page,
                   int64_t slot, int64_t g) {
  const SnapshotDims& d = p.dims;
  const int64_t elems =
      layout == KvLayout::kNHD
          ? ((page * d.page_size + slot) * d.kv_heads + g) * d.head_dim
          : ((page * d.kv_heads + g) * d.page_size + slot) * d.head_dim;
  return elems;
}

// Copies token (page, slot)'s rows of all KV heads to dst ([Hkv][D]).
void CopyToken(const PreparedAttention& p, const void* data, DType dtype,
               KvLayout layout, int64_t page, int64_t slot, char* dst) {
  const int64_t e = DTypeSize(dtype);
  const char* src = static_cast<const char*>(data);
  const int64_t row = p.dims.head_dim * e;
  if (layout == KvLayout::kNHD) {
    std::memcpy(dst, src + PoolOffset(p, layout, page, slot, 0) * e,
                static_cast<size_t>(p.dims.kv_heads * row));
    return;
  }
  for (int64_t g = 0; g < p.dims.kv_heads; ++g) {
    std::memcpy(dst + g * row, src + PoolOffset(p, layout, page, slot, g) * e,
                static_cast<size_t>(row));
  }
}

struct FirstError {
  std::mutex mu;
  absl::Status status;
  void Set(const absl::Status& s) {
    if (s.ok()) return;
    std::lock_guard<std::mutex> lock(mu);
    if (status.ok()) status = s;
  }
  absl::Status Get() {
    std::lock_guard<std::mutex> lock(mu);
    return status;
  }
};

// One item of compute: rank `rank` computes the units of the chunk it holds
// for row b, KV heads [g0, g1).
struct Task {
  int64_t rank, b, g0, g1;
};

class Replay {
 public:
  Replay(const PreparedAttention& p, const CpSchedule& schedule,
         CpTransport* transport, const CpReplayOptions& options)
      : p_(p),
        sched_(schedule),
        shards_(schedule.shards()),
        transport_(transport),
        options_(options),
        world_(schedule.world()),
        held_(static_cast<size_t>(world_)),
        compute_ns_(static_cast<size_t>(world_)),
        transport_ns_(static_cast<size_t>(world_)) {}

  absl::Status Run(CpExecution execution, CpReplayRun* out);

 private:
  // What rank k holds at the current step.
  struct Held {
    int64_t source = 0;
    int64_t chunk = 0;
    int64_t bytes = 0;
    std::vector<int64_t> row_offset;  // per row of the pass
  };

  bool Cancelled() const {
    return options_.cancelled != nullptr && options_.cancelled->load();
  }
  absl::Status GrantInitial(int64_t k);
  absl::Status Acquire(int64_t k, int64_t s);
  absl::Status Fill(int64_t k, int64_t s, const CpStep& step);
  absl::Status ReadHeader(int64_t k, int64_t s, const CpStep& step);
  absl::Status SendIfDue(int64_t k, int64_t s);
  absl::Status Compute(const Task& task, int64_t s);
  absl::Status Finish(int64_t k, int64_t s);
  absl::Status RankStep(int64_t k, int64_t s);
  void AppendTasks(int64_t k, int64_t s, std::vector<Task>* tasks) const;
  absl::Status RunLockstep();
  absl::Status RunThreadPerRank();
  void AddNs(std::vector<std::atomic<int64_t>>& v, int64_t k,
             Clock::time_point start) {
    v[static_cast<size_t>(k)].fetch_add(
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() -
                                                             start)
            .count(),
        std::memory_order_relaxed);
  }

  const PreparedAttention& p_;
  const CpSchedule& sched_;
  const CpShards& shards_;
  CpTransport* transport_;
  const CpReplayOptions& options_;
  const int64_t world_;
  std::vector<Held> held_;
  std::vector<std::atomic<int64_t>> compute_ns_;
  std::vector<std::atomic<int64_t>> transport_ns_;
  UnitStates states_;
};

absl::Status Replay::GrantInitial(int64_t k) {
  for (int64_t t = 0; t < 2; ++t) {
    if (sched_.Receives(t)) {
      if (absl::Status s = transport_->Release(k, t); !s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

// Round 0: rank k gathers chunk c of its own shard, for every row of the
// pass, into its slot.
absl::Status Replay::Fill(int64_t k, int64_t s, const CpStep& step) {
  const CpPass& pass = sched_.passes()[step.pass];
  char* slot = transport_->Slot(k, CpSchedule::Slot(s));
  const int64_t rows = pass.row_end - pass.row_begin;
  Header header{k, step.pass, step.chunk, rows};
  std::memcpy(slot, &header, sizeof(header));
  int64_t* counts = reinterpret_cast<int64_t*>(slot + kHeaderBytes);
  int64_t at = kHeaderBytes + 8 * rows;
  const int64_t ek = DTypeSize(p_.k_dtype) * ElemsPerToken(p_);
  const int64_t ev = DTypeSize(p_.v_dtype) * ElemsPerToken(p_);
  const int64_t P = p_.dims.page_size;
  for (int64_t b = pass.row_begin; b < pass.row_end; ++b) {
    const CpChunk* chunk = shards_.Chunk(b, k, step.chunk);
    const int64_t n = chunk == nullptr ? 0 : chunk->tokens;
    counts[b - pass.row_begin] = n;
    if (n == 0) continue;
    int64_t* positions = reinterpret_cast<int64_t*>(slot + at);
    char* k_rows = slot + at + 8 * n;
    char* v_rows = k_rows + n * ek;
    int64_t t = 0;
    const int32_t* units = shards_.ChunkUnits(b, *chunk);
    for (int32_t i = 0; i < chunk->unit_end - chunk->unit_begin; ++i) {
      const KvUnit& u = p_.units[b][static_cast<size_t>(units[i])];
      const int64_t page = p_.layout->block_pages[b][u.block];
      for (int64_t j = u.first; j < u.first + u.count; ++j, ++t) {
        positions[t] = p_.snapshot->slot_positions.IntAt(page * P + j);
        CopyToken(p_, p_.k_data, p_.k_dtype, p_.k_layout, page, j,
                  k_rows + t * ek);
        CopyToken(p_, p_.v_data, p_.v_dtype, p_.v_layout, page, j,
                  v_rows + t * ev);
      }
    }
    at += Pad8(n * (8 + ek + ev));
  }
  held_[k].bytes = at;
  return ReadHeader(k, s, step);
}

// Checks that the slot holds what the schedule says rank k holds at step s
// (a chunk of the SOURCE rank's shard, masked by that shard's length) and
// records where each row's tokens are.
absl::Status Replay::ReadHeader(int64_t k, int64_t s, const CpStep& step) {
  const CpPass& pass = sched_.passes()[step.pass];
  const char* slot = transport_->Slot(k, CpSchedule::Slot(s));
  Header h;
  std::memcpy(&h, slot, sizeof(h));
  const int64_t source = sched_.SourceRank(k, step.round);
  const int64_t rows = pass.row_end - pass.row_begin;
  if (h.source != source || h.pass != step.pass || h.chunk != step.chunk ||
      h.rows != rows) {
    return absl::InternalError(absl::StrCat(
        "cp ring: rank ", k, " at step ", s, " expected chunk ", step.chunk,
        " of rank ", source, " (pass ", step.pass, "), got chunk ", h.chunk,
        " of rank ", h.source, " (pass ", h.pass, ")"));
  }
  Held& held = held_[k];
  held.source = source;
  held.chunk = step.chunk;
  held.row_offset.assign(static_cast<size_t>(rows), 0);
  const int64_t* counts = reinterpret_cast<const int64_t*>(slot + kHeaderBytes);
  const int64_t per_token = CpTokenBytes(p_);
  int64_t at = kHeaderBytes + 8 * rows;
  for (int64_t i = 0; i < rows; ++i) {
    const CpChunk* chunk =
        shards_.Chunk(pass.row_begin + i, source, step.chunk);
    const int64_t want = chunk == nullptr ? 0 : chunk->tokens;
    if (counts[i] != want) {
      return absl::InternalError(absl::StrCat(
          "cp ring: rank ", k, " at step ", s, " holds ", counts[i],
          " tokens of row ", pass.row_begin + i, " where rank ", source,
          "'s chunk ", step.chunk, " has ", want));
    }
    held.row_offset[static_cast<size_t>(i)] = at;
    at += Pad8(want * per_token);
  }
  if (at > held.bytes) {
    return absl::InternalError(absl::StrCat("cp ring: rank ", k, " at step ", s,
                                            " received ", held.bytes,
                                            " bytes, the chunk needs ", at));
  }
  return absl::OkStatus();
}

absl::Status Replay::Acquire(int64_t k, int64_t s) {
  const Clock::time_point start = Clock::now();
  const CpStep step = sched_.StepAt(s);
  absl::Status status;
  if (!sched_.Receives(s)) {
    status = Fill(k, s, step);
  } else {
    absl::StatusOr<int64_t> bytes = transport_->Receive(k, s);
    if (!bytes.ok()) {
      status = bytes.status();
    } else {
      held_[k].bytes = *bytes;
      status = ReadHeader(k, s, step);
    }
  }
  if (status.ok()) status = SendIfDue(k, s);
  AddNs(transport_ns_, k, start);
  return status;
}

absl::Status Replay::SendIfDue(int64_t k, int64_t s) {
  if (!sched_.Sends(s)) return absl::OkStatus();
  return transport_->Send(k, s, held_[k].bytes);
}

absl::Status Replay::Compute(const Task& task, int64_t s) {
  const Clock::time_point start = Clock::now();
  const Held& held = held_[task.rank];
  const CpStep step = sched_.StepAt(s);
  const CpPass& pass = sched_.passes()[step.pass];
  const CpChunk* chunk = shards_.Chunk(task.b, held.source, held.chunk);
  const char* slot = transport_->Slot(task.rank, CpSchedule::Slot(s));
  const char* base =
      slot + held.row_offset[static_cast<size_t>(task.b - pass.row_begin)];
  const int64_t n = chunk->tokens;
  const int64_t elems = ElemsPerToken(p_);
  TokenRun run;
  run.positions = reinterpret_cast<const int64_t*>(base);
  run.k_data = base + 8 * n;
  run.k_dtype = p_.k_dtype;
  run.v_data = base + 8 * n + n * elems * DTypeSize(p_.k_dtype);
  run.v_dtype = p_.v_dtype;
  run.k_row_stride = run.v_row_stride = elems;
  run.k_head_stride = run.v_head_stride = p_.dims.head_dim;
  run.n = n;
  const int32_t* units = shards_.ChunkUnits(task.b, *chunk);
  int32_t first = 0;
  for (int32_t i = 0; i < chunk->unit_end - chunk->unit_begin; ++i) {
    const int32_t count = p_.units[task.b][static_cast<size_t>(units[i])].count;
    run.unit_of.push_back(units[i]);
    run.first.push_back(first);
    run.count.push_back(count);
    first += count;
  }
  absl::Status status =
      ComputeRunStates(p_, run, task.b, task.g0, task.g1, &states_);
  AddNs(compute_ns_, task.rank, start);
  return status;
}

absl::Status Replay::Finish(int64_t k, int64_t s) {
  const Clock::time_point start = Clock::now();
  absl::Status status;
  if (sched_.Sends(s)) status = transport_->WaitSent(k, s);
  // The slot's last read is done (compute and the forwarding send).
  if (status.ok() && sched_.GrantsAfter(s)) {
    status = transport_->Release(k, s + 2);
  }
  AddNs(transport_ns_, k, start);
  return status;
}

// Ring: the KV heads of each row that rank k owns, in runs of consecutive
// heads. Partials: every head of each row whose own chunk exists.
void Replay::AppendTasks(int64_t k, int64_t s, std::vector<Task>* tasks) const {
  const Held& held = held_[k];
  const CpPass& pass = sched_.passes()[sched_.StepAt(s).pass];
  const int64_t hkv = p_.dims.kv_heads;
  for (int64_t b = pass.row_begin; b < pass.row_end; ++b) {
    if (shards_.Chunk(b, held.source, held.chunk) == nullptr) continue;
    if (sched_.strategy() == CpReplayStrategy::kPartials) {
      tasks->push_back({k, b, 0, hkv});
      continue;
    }
    for (int64_t g = 0; g < hkv;) {
      if (sched_.ItemOwner(b, g) != k) {
        ++g;
        continue;
      }
      int64_t g1 = g + 1;
      while (g1 < hkv && sched_.ItemOwner(b, g1) == k) ++g1;
      tasks->push_back({k, b, g, g1});
      g = g1;
    }
  }
}

// One step of rank k: take the held chunk (fill or receive) and send it
// on, compute its units for the rank's items, then let go of the slot.
absl::Status Replay::RankStep(int64_t k, int64_t s) {
  if (absl::Status st = Acquire(k, s); !st.ok()) return st;
  thread_local std::vector<Task> tasks;
  tasks.clear();
  AppendTasks(k, s, &tasks);
  for (const Task& task : tasks) {
    if (absl::Status st = Compute(task, s); !st.ok()) return st;
  }
  return Finish(k, s);
}

// Ranks in turns: within a step the ranks depend on nothing the others do
// in that step (a receive waits for the previous step's send, a send for
// the previous step's grant), so every step is one parallel loop over the
// ranks on a bounded pool, with one barrier per step.
absl::Status Replay::RunLockstep() {
  const int threads = ResolveThreads(options_.threads);
  FirstError error;
  ParallelFor(world_, threads, [&](int64_t k) { error.Set(GrantInitial(k)); });
  for (int64_t s = 0; s < sched_.steps(); ++s) {
    if (Cancelled()) return absl::CancelledError("audit cancelled");
    ParallelFor(world_, threads, [&](int64_t k) { error.Set(RankStep(k, s)); });
    if (absl::Status e = error.Get(); !e.ok()) return e;
  }
  return error.Get();
}

// One thread per rank, each as fast as the protocol lets it run.
absl::Status Replay::RunThreadPerRank() {
  FirstError error;
  auto rank_loop = [&](int64_t k) {
    absl::Status status = GrantInitial(k);
    for (int64_t s = 0; status.ok() && s < sched_.steps(); ++s) {
      status = Cancelled() ? absl::CancelledError("audit cancelled")
                           : RankStep(k, s);
    }
    if (!status.ok()) {
      error.Set(status);
      transport_->Abort(status);  // no rank may wait for this one forever
    }
  };
  std::vector<std::thread> ranks;
  ranks.reserve(static_cast<size_t>(world_));
  for (int64_t k = 0; k < world_; ++k) ranks.emplace_back(rank_loop, k);
  for (std::thread& t : ranks) t.join();
  return error.Get();
}

absl::Status Replay::Run(CpExecution execution, CpReplayRun* out) {
  const Clock::time_point start = Clock::now();
  states_.Reset(p_.units, p_.dims, /*with_reference=*/false);
  absl::Status status = execution == CpExecution::kThreadPerRank
                            ? RunThreadPerRank()
                            : RunLockstep();
  // The ring must end as it started, with no credit or message in flight:
  // anything left over means the schedule and the transport disagreed.
  if (status.ok()) status = transport_->Drained();
  if (!status.ok()) {
    transport_->Abort(status);
    return status;
  }
  out->states = std::move(states_);
  out->execution = execution;
  out->steps = sched_.steps();
  out->rounds = sched_.rounds();
  out->passes = static_cast<int64_t>(sched_.passes().size());
  for (int64_t k = 0; k < world_; ++k) {
    out->rank_compute_seconds.push_back(compute_ns_[k].load() * 1e-9);
    out->rank_transport_seconds.push_back(transport_ns_[k].load() * 1e-9);
  }
  out->seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return absl::OkStatus();
}

}  // namespace

const char* CpExecutionName(CpExecution execution) {
  switch (execution) {
    case CpExecution::kLockstep:
      return "lockstep";
    case CpExecution::kThreadPerRank:
      return "thread_per_rank";
    case CpExecution::kAuto:
      break;
  }
  return "auto";
}

int64_t CpTokenBytes(const PreparedAttention& p) {
  return 8 + ElemsPerToken(p) * (DTypeSize(p.k_dtype) + DTypeSize(p.v_dtype));
}

int64_t CpSlotBytes(const PreparedAttention& p, const CpSchedule& schedule) {
  int64_t rows = 0;
  for (const CpPass& pass : schedule.passes()) {
    rows = std::max(rows, pass.row_end - pass.row_begin);
  }
  // Header, counts and per-row padding on top of the payload bound.
  return schedule.max_message_bytes() + kHeaderBytes + 16 * rows;
}

absl::StatusOr<CpReplayRun> RunCpReplay(const PreparedAttention& prepared,
                                        const CpSchedule& schedule,
                                        const CpReplayOptions& options) {
  const int64_t world = schedule.world();
  std::unique_ptr<InProcessTransport> owned;
  CpTransport* transport = options.transport;
  const int64_t slot_bytes = CpSlotBytes(prepared, schedule);
  if (transport == nullptr) {
    absl::StatusOr<std::unique_ptr<InProcessTransport>> made =
        InProcessTransport::Create(world, slot_bytes, options.max_buffer_bytes);
    if (!made.ok()) return made.status();
    owned = *std::move(made);
    transport = owned.get();
  } else if (transport->world() != world ||
             transport->slot_bytes() < slot_bytes) {
    return absl::InternalError(absl::StrCat(
        "cp replay: the transport has ", transport->world(), " ranks of ",
        transport->slot_bytes(), "-byte slots; the schedule needs ", world,
        " of ", slot_bytes));
  }
  CpExecution execution = options.execution;
  if (execution == CpExecution::kAuto) {
    const int64_t workers =
        options.workers > 0 ? options.workers : ResolveThreads(options.threads);
    execution = schedule.strategy() == CpReplayStrategy::kRing && world > 1 &&
                        world <= workers
                    ? CpExecution::kThreadPerRank
                    : CpExecution::kLockstep;
  }
  CpReplayRun run;
  Replay replay(prepared, schedule, transport, options);
  if (absl::Status s = replay.Run(execution, &run); !s.ok()) return s;
  return run;
}

}  // namespace attnaudit
