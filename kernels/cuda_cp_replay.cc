// CudaBackend::ReplayCp: the CP schedule (core/cp/schedule) run on GPUs.
// Rank k is a CUDA stream of GPU k mod G (G = 1: this backend's GPU and the
// CUDA-local transport; a gang: its GPUs and the NCCL transport). The host
// issues the schedule step by step (all ranks' receives and sends, then all
// ranks' computes: the order NcclTransport needs), and the device runs the
// ranks' streams concurrently, ordered only by the transport's events.
//
// A rank's step message (the chunk it holds) is laid out for the device:
// per row of the pass its positions (padded to 16 bytes), its K rows
// [token][Hkv][D], its V rows, padded to 16 bytes -- so the unit kernel
// reads it with 16-byte copies like a page. Layouts follow from the
// schedule alone, so they are planned once on the host (the CPU replay
// checks its message headers; its tests cover the protocol).
#include <algorithm>
#include <chrono>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "kernels/attention_kernels.h"
#include "kernels/collective_watchdog.h"
#include "kernels/cuda_backend.h"
#include "kernels/cuda_check.h"
#include "kernels/cuda_gang.h"
#include "kernels/cuda_transports.h"
#include "kernels/device_memory.h"
#include "kernels/device_snapshot.h"

namespace attnaudit {
namespace {

using cuda_internal::DeviceSnapshot;
using cuda_internal::GatherToken;
using cuda_internal::PassParams;
using cuda_internal::PassRun;
using cuda_internal::PassUnit;
using cuda_internal::RankPlacement;
using Clock = std::chrono::steady_clock;

int64_t Align16(int64_t x) { return (x + 15) / 16 * 16; }

// One (source rank, pass, chunk): its message and the work on it.
struct ChunkPlan {
  int64_t bytes = 0;
  int32_t row_runs = 0;  // rows + 1 entries of Plans::row_runs
  int32_t gather_begin = 0;
  int32_t gather_end = 0;
};

struct Plans {
  std::vector<ChunkPlan> chunks;
  std::vector<int64_t> first_of;  // [source * passes + pass] -> chunks index
  std::vector<PassRun> runs;
  std::vector<PassUnit> units;
  std::vector<int32_t> row_runs;
  std::vector<GatherToken> gather;
  int64_t max_bytes = 16;

  const ChunkPlan& At(const CpSchedule& s, int64_t source, int64_t pass,
                      int64_t chunk) const {
    const int64_t passes = static_cast<int64_t>(s.passes().size());
    return chunks[first_of[source * passes + pass] + chunk];
  }
};

// The runs, units and fill of one row's chunk at byte `at` of the message.
int64_t PlanRow(const PreparedAttention& p, const CpShards& shards, int64_t b,
                const CpChunk& chunk, int64_t at, Plans* out) {
  const SnapshotDims& d = p.dims;
  const int64_t n = chunk.tokens;
  const int64_t token_k = d.kv_heads * d.head_dim * DTypeSize(p.k_dtype);
  const int64_t token_v = d.kv_heads * d.head_dim * DTypeSize(p.v_dtype);
  const int64_t k_at = at + Align16(8 * n);
  const int64_t v_at = k_at + n * token_k;
  PassRun run;
  run.k_offset = k_at;
  run.v_offset = v_at;
  run.pos_offset = at / 8;
  run.n = static_cast<int32_t>(n);
  run.unit_begin = static_cast<int32_t>(out->units.size());
  int64_t k_row = 0;
  int64_t head = 0;
  cuda_internal::PoolStrides(p.k_layout, d, &k_row, &head);
  int64_t v_row = 0;
  cuda_internal::PoolStrides(p.v_layout, d, &v_row, &head);
  const int64_t page_elems = d.page_size * d.kv_heads * d.head_dim;
  const int32_t* units = shards.ChunkUnits(b, chunk);
  int32_t t = 0;
  for (int32_t i = 0; i < chunk.unit_end - chunk.unit_begin; ++i) {
    const KvUnit& u = p.units[b][static_cast<size_t>(units[i])];
    out->units.push_back({units[i], t, u.count, 0});
    const int64_t page = p.layout->block_pages[b][u.block];
    for (int64_t j = u.first; j < u.first + u.count; ++j, ++t) {
      GatherToken g;
      g.k_src = (page * page_elems + j * k_row) * DTypeSize(p.k_dtype);
      g.v_src = (page * page_elems + j * v_row) * DTypeSize(p.v_dtype);
      g.pos_src = page * d.page_size + j;
      g.pos_dst = at + 8 * t;
      g.k_dst = k_at + t * token_k;
      g.v_dst = v_at + t * token_v;
      out->gather.push_back(g);
    }
  }
  run.unit_end = static_cast<int32_t>(out->units.size());
  out->runs.push_back(run);
  return Align16(v_at + n * token_v);
}

Plans PlanChunks(const PreparedAttention& p, const CpSchedule& s) {
  const CpShards& shards = s.shards();
  Plans out;
  for (int64_t source = 0; source < s.world(); ++source) {
    for (const CpPass& pass : s.passes()) {
      out.first_of.push_back(static_cast<int64_t>(out.chunks.size()));
      for (int64_t c = 0; c < pass.chunks; ++c) {
        ChunkPlan plan;
        plan.row_runs = static_cast<int32_t>(out.row_runs.size());
        plan.gather_begin = static_cast<int32_t>(out.gather.size());
        out.row_runs.push_back(static_cast<int32_t>(out.runs.size()));
        int64_t at = 0;
        for (int64_t b = pass.row_begin; b < pass.row_end; ++b) {
          const CpChunk* chunk = shards.Chunk(b, source, c);
          if (chunk != nullptr) at = PlanRow(p, shards, b, *chunk, at, &out);
          out.row_runs.push_back(static_cast<int32_t>(out.runs.size()));
        }
        plan.gather_end = static_cast<int32_t>(out.gather.size());
        plan.bytes = at;
        out.max_bytes = std::max(out.max_bytes, at);
        out.chunks.push_back(plan);
      }
    }
  }
  return out;
}

// What one GPU of the replay holds.
struct GpuPart {
  CudaBackend* backend = nullptr;
  DeviceSnapshot snap;
  PassRun* runs = nullptr;
  PassUnit* units = nullptr;
  int32_t* row_runs = nullptr;
  GatherToken* gather = nullptr;
  float* state_out = nullptr;
  float* state_lse = nullptr;
  int* kv_non_finite = nullptr;
  UnitStates host;  // its states, fetched at the end
};

// The pool pages GPU `gpu` of `gpus` reads: the pages of the fills of the
// chunks its ranks (rank k on GPU k mod gpus) start the ring with; every
// other chunk reaches them around the ring.
ShardPages PagesOfGpu(const PreparedAttention& p, const CpSchedule& s,
                      const Plans& plans, int64_t gpu, int64_t gpus) {
  const SnapshotDims& d = p.dims;
  const int64_t k_page =
      d.page_size * d.kv_heads * d.head_dim * DTypeSize(p.k_dtype);
  const int64_t passes = static_cast<int64_t>(s.passes().size());
  std::vector<int64_t> used;
  for (int64_t source = gpu; source < s.world(); source += gpus) {
    for (int64_t pass = 0; pass < passes; ++pass) {
      for (int64_t c = 0; c < s.passes()[pass].chunks; ++c) {
        const ChunkPlan& plan = plans.At(s, source, pass, c);
        for (int32_t t = plan.gather_begin; t < plan.gather_end; ++t) {
          used.push_back(plans.gather[t].k_src / k_page);
        }
      }
    }
  }
  return ShardPages::Of(used, d.num_pages);
}

// The fills pointing into `shard`'s compact copy (a fill of a page the GPU
// does not hold is another GPU's and never runs here: zeroed).
std::vector<GatherToken> CompactFills(const PreparedAttention& p,
                                      const ShardPages& shard,
                                      const std::vector<GatherToken>& fills) {
  const SnapshotDims& d = p.dims;
  const int64_t page_elems = d.page_size * d.kv_heads * d.head_dim;
  const int64_t k_page = page_elems * DTypeSize(p.k_dtype);
  const int64_t v_page = page_elems * DTypeSize(p.v_dtype);
  std::vector<GatherToken> out = fills;
  for (GatherToken& g : out) {
    if (!shard.Holds(g.k_src / k_page)) {
      g = GatherToken{};
      continue;
    }
    g.k_src = shard.Compact(g.k_src, k_page);
    g.v_src = shard.Compact(g.v_src, v_page);
    g.pos_src = shard.Compact(g.pos_src, d.page_size);
  }
  return out;
}

// Uploads what GPU `gpu` of the replay reads: with `by_shard`, its shard
// of the pool (the whole pool when its ranks read every page), else the
// pool; then the plans and its states.
absl::Status SetUpGpu(const PreparedAttention& p, const CpSchedule& s,
                      const Plans& plans, int64_t gpu, int64_t gpus,
                      bool by_shard, GpuPart* g) {
  CudaBackend& b = *g->backend;
  ATTNAUDIT_CUDA_RETURN_IF_ERROR(cudaSetDevice(b.device()));
  b.arena().Reset();
  cudaStream_t st = b.stream();
  const ShardPages shard =
      by_shard ? PagesOfGpu(p, s, plans, gpu, gpus) : ShardPages::Of({}, 0);
  ATTNAUDIT_ASSIGN_OR_RETURN(
      g->snap, cuda_internal::UploadSnapshot(p, b.arena(), b.staging(), st,
                                             by_shard ? &shard : nullptr));
  ATTNAUDIT_ASSIGN_OR_RETURN(
      g->runs, UploadVector(plans.runs, "cp runs", b.arena(), b.staging(), st));
  ATTNAUDIT_ASSIGN_OR_RETURN(
      g->units,
      UploadVector(plans.units, "cp units", b.arena(), b.staging(), st));
  ATTNAUDIT_ASSIGN_OR_RETURN(
      g->row_runs,
      UploadVector(plans.row_runs, "cp row runs", b.arena(), b.staging(), st));
  const std::vector<GatherToken> fills =
      !by_shard || shard.whole_pool() ? plans.gather
                                      : CompactFills(p, shard, plans.gather);
  ATTNAUDIT_ASSIGN_OR_RETURN(
      g->gather, UploadVector(fills, "cp fills", b.arena(), b.staging(), st));
  g->host.Reset(p.units, p.dims, /*with_reference=*/false);
  ATTNAUDIT_ASSIGN_OR_RETURN(
      g->state_out, UploadVector(g->host.p_out, "cp unit states", b.arena(),
                                 b.staging(), st));
  ATTNAUDIT_ASSIGN_OR_RETURN(
      g->state_lse, UploadVector(g->host.p_lse, "cp unit states", b.arena(),
                                 b.staging(), st));
  ATTNAUDIT_ASSIGN_OR_RETURN(g->kv_non_finite,
                             b.arena().AllocateArray<int>(1, "a flag"));
  ATTNAUDIT_CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(g->kv_non_finite, 0, sizeof(int), st));
  ATTNAUDIT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(st));
  return absl::OkStatus();
}

// Per rank: a stream and two events per step for its compute time.
struct RankRuntime {
  GpuPart* gpu = nullptr;
  cudaStream_t stream = nullptr;
  std::vector<cudaEvent_t> marks;  // [2 * steps]: compute start, end
  cudaEvent_t begin = nullptr;
  cudaEvent_t end = nullptr;
};

class GpuReplay {
 public:
  GpuReplay(const PreparedAttention& p, const CpSchedule& s,
            const CpReplayOptions& o, std::vector<GpuPart>* gpus)
      : p_(p), s_(s), o_(o), gpus_(*gpus) {}
  ~GpuReplay();

  absl::Status Run(CudaGang* gang, CpReplayRun* out);

 private:
  absl::Status SetUpRanks(CudaGang* gang);
  absl::Status StepA(int64_t k, int64_t step);
  absl::Status StepB(int64_t k, int64_t step);
  absl::Status Compute(int64_t k, int64_t step, const ChunkPlan& plan);
  absl::Status Collect(CpReplayRun* out);
  // Waits until every rank's `end` event has passed; over a multi-GPU gang
  // under the collective watchdog (a dead peer aborts the communicators
  // instead of blocking the worker forever).
  absl::Status AwaitRanks();
  const ChunkPlan& Held(int64_t k, int64_t step) const {
    const CpStep st = s_.StepAt(step);
    return plans_.At(s_, s_.SourceRank(k, st.round), st.pass, st.chunk);
  }

  const PreparedAttention& p_;
  const CpSchedule& s_;
  const CpReplayOptions& o_;
  std::vector<GpuPart>& gpus_;
  Plans plans_;
  std::vector<RankRuntime> ranks_;
  std::unique_ptr<CpTransport> transport_;
  CudaGang* gang_ = nullptr;
};

GpuReplay::~GpuReplay() {
  transport_.reset();
  for (RankRuntime& r : ranks_) {
    cudaSetDevice(r.gpu->backend->device());
    if (r.stream != nullptr) cudaStreamSynchronize(r.stream);
    for (cudaEvent_t e : r.marks) cudaEventDestroy(e);
    if (r.begin != nullptr) cudaEventDestroy(r.begin);
    if (r.end != nullptr) cudaEventDestroy(r.end);
    if (r.stream != nullptr) cudaStreamDestroy(r.stream);
  }
}

absl::Status GpuReplay::SetUpRanks(CudaGang* gang) {
  const int64_t world = s_.world();
  const int64_t g = static_cast<int64_t>(gpus_.size());
  // Per-step timing events only while their count stays small.
  const bool timed = s_.steps() * world <= 8192;
  std::vector<RankPlacement> places;
  for (int64_t k = 0; k < world; ++k) {
    RankRuntime r;
    r.gpu = &gpus_[k % g];
    CudaBackend& b = *r.gpu->backend;
    ATTNAUDIT_CUDA_RETURN_IF_ERROR(cudaSetDevice(b.device()));
    ATTNAUDIT_CUDA_RETURN_IF_ERROR(
        cudaStreamCreateWithFlags(&r.stream, cudaStreamNonBlocking));
    ATTNAUDIT_CUDA_RETURN_IF_ERROR(cudaEventCreate(&r.begin));
    ATTNAUDIT_CUDA_RETURN_IF_ERROR(cudaEventCreate(&r.end));
    for (int64_t i = 0; timed && i < 2 * s_.steps(); ++i) {
      cudaEvent_t e = nullptr;
      ATTNAUDIT_CUDA_RETURN_IF_ERROR(cudaEventCreate(&e));
      r.marks.push_back(e);
    }
    RankPlacement place;
    place.device = b.device();
    place.stream = r.stream;
    for (char*& slot : place.slots) {
      ATTNAUDIT_ASSIGN_OR_RETURN(
          slot, b.arena().Allocate(plans_.max_bytes, "cp slots"));
    }
    places.push_back(place);
    ranks_.push_back(std::move(r));
  }
  if (gang == nullptr || gang->size() == 1) {
    ATTNAUDIT_ASSIGN_OR_RETURN(transport_,
                               cuda_internal::CudaLocalTransport::Create(
                                   std::move(places), plans_.max_bytes));
    return absl::OkStatus();
  }
#ifdef ATTNAUDIT_HAVE_NCCL
  ATTNAUDIT_ASSIGN_OR_RETURN(
      transport_, cuda_internal::NcclTransport::Create(std::move(places),
                                                       plans_.max_bytes, gang));
  return absl::OkStatus();
#else
  return absl::FailedPreconditionError(
      "cp replay across GPUs: this build has no NCCL");
#endif
}

// Phase A of a step for rank k: fill the slot from its own shard (round 0)
// or take the received chunk, then send it on.
absl::Status GpuReplay::StepA(int64_t k, int64_t step) {
  RankRuntime& r = ranks_[k];
  const ChunkPlan& plan = Held(k, step);
  ATTNAUDIT_CUDA_RETURN_IF_ERROR(cudaSetDevice(r.gpu->backend->device()));
  if (!s_.Receives(step)) {
    cuda_internal::GatherParams g;
    g.k_base = r.gpu->snap.k;
    g.v_base = r.gpu->snap.v;
    g.positions = r.gpu->snap.positions;
    g.slot = transport_->Slot(k, CpSchedule::Slot(step));
    g.tokens = r.gpu->gather + plan.gather_begin;
    g.count = plan.gather_end - plan.gather_begin;
    g.kv_heads = p_.dims.kv_heads;
    g.k_row_bytes = p_.dims.head_dim * DTypeSize(p_.k_dtype);
    g.v_row_bytes = p_.dims.head_dim * DTypeSize(p_.v_dtype);
    int64_t row = 0;
    int64_t head = 0;
    cuda_internal::PoolStrides(p_.k_layout, p_.dims, &row, &head);
    g.k_head_stride_bytes = head * DTypeSize(p_.k_dtype);
    cuda_internal::PoolStrides(p_.v_layout, p_.dims, &row, &head);
    g.v_head_stride_bytes = head * DTypeSize(p_.v_dtype);
    ATTNAUDIT_RETURN_IF_ERROR(cuda_internal::LaunchGather(g, r.stream));
  } else {
    absl::StatusOr<int64_t> bytes = transport_->Receive(k, step);
    if (!bytes.ok()) return bytes.status();
    if (*bytes != plan.bytes) {
      return absl::InternalError(
          absl::StrCat("cp ring: rank ", k, " at step ", step, " received ",
                       *bytes, " bytes; the chunk it holds has ", plan.bytes));
    }
  }
  if (s_.Sends(step)) return transport_->Send(k, step, plan.bytes);
  return absl::OkStatus();
}

absl::Status GpuReplay::Compute(int64_t k, int64_t step,
                                const ChunkPlan& plan) {
  RankRuntime& r = ranks_[k];
  const CpPass& pass = s_.passes()[s_.StepAt(step).pass];
  char* slot = transport_->Slot(k, CpSchedule::Slot(step));
  PassParams params = cuda_internal::BaseParams(p_, r.gpu->snap);
  params.k_base = slot;
  params.v_base = slot;
  params.positions = reinterpret_cast<const int64_t*>(slot);
  params.k_row_stride = params.v_row_stride =
      p_.dims.kv_heads * p_.dims.head_dim;
  params.k_head_stride = params.v_head_stride = p_.dims.head_dim;
  params.row_begin = pass.row_begin;
  params.rows = pass.row_end - pass.row_begin;
  params.runs = r.gpu->runs;
  params.units = r.gpu->units;
  params.row_runs = r.gpu->row_runs + plan.row_runs;
  if (s_.strategy() == CpReplayStrategy::kRing) {
    params.owner_world = s_.world();
    params.owner_rank = k;
  }
  params.store_p_states = 1;
  params.specialized = r.gpu->backend->specialized_kernels() ? 1 : 0;
  params.p_state_out = r.gpu->state_out;
  params.p_state_lse = r.gpu->state_lse;
  params.kv_non_finite = r.gpu->kv_non_finite;
  int max_shared = 0;
  ATTNAUDIT_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(
      &max_shared, cudaDevAttrMaxSharedMemoryPerBlockOptin,
      r.gpu->backend->device()));
  if (!cuda_internal::FitPassToSharedMemory(&params, max_shared)) {
    return absl::UnimplementedError(
        "cuda: a CP chunk does not fit one thread block's shared memory");
  }
  return cuda_internal::LaunchFusedPass(params, r.stream);
}

// Phase B: compute the held chunk's units for the rank's items, then let
// go of the slot.
absl::Status GpuReplay::StepB(int64_t k, int64_t step) {
  RankRuntime& r = ranks_[k];
  ATTNAUDIT_CUDA_RETURN_IF_ERROR(cudaSetDevice(r.gpu->backend->device()));
  const bool timed = !r.marks.empty();
  if (timed) {
    ATTNAUDIT_CUDA_RETURN_IF_ERROR(
        cudaEventRecord(r.marks[2 * step], r.stream));
  }
  const ChunkPlan& plan = Held(k, step);
  if (plan.bytes > 0) ATTNAUDIT_RETURN_IF_ERROR(Compute(k, step, plan));
  if (timed) {
    ATTNAUDIT_CUDA_RETURN_IF_ERROR(
        cudaEventRecord(r.marks[2 * step + 1], r.stream));
  }
  if (s_.Sends(step)) ATTNAUDIT_RETURN_IF_ERROR(transport_->WaitSent(k, step));
  if (s_.GrantsAfter(step)) {
    ATTNAUDIT_RETURN_IF_ERROR(transport_->Release(k, step + 2));
  }
  return absl::OkStatus();
}

absl::Status GpuReplay::Run(CudaGang* gang, CpReplayRun* out) {
  gang_ = gang;
  plans_ = PlanChunks(p_, s_);
  if (plans_.max_bytes > o_.max_buffer_bytes / 2 / s_.world()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cp.world_size: the ring's buffers (2 slots x ", s_.world(),
        " ranks x ", plans_.max_bytes, " bytes) exceed the limit of ",
        o_.max_buffer_bytes, " bytes"));
  }
  const int64_t gpus = static_cast<int64_t>(gpus_.size());
  // One GPU reads every rank's pages: its shard is the pool, uploaded as
  // it is (unless a test asks for the shard path).
  const bool by_shard = gpus > 1 || gpus_[0].backend->shard_uploads();
  for (int64_t i = 0; i < gpus; ++i) {
    ATTNAUDIT_RETURN_IF_ERROR(
        SetUpGpu(p_, s_, plans_, i, gpus, by_shard, &gpus_[i]));
  }
  ATTNAUDIT_RETURN_IF_ERROR(SetUpRanks(gang));
  const int64_t world = s_.world();
  for (int64_t k = 0; k < world; ++k) {
    ATTNAUDIT_CUDA_RETURN_IF_ERROR(
        cudaSetDevice(ranks_[k].gpu->backend->device()));
    ATTNAUDIT_CUDA_RETURN_IF_ERROR(
        cudaEventRecord(ranks_[k].begin, ranks_[k].stream));
    for (int64_t t = 0; t < 2; ++t) {
      if (s_.Receives(t)) ATTNAUDIT_RETURN_IF_ERROR(transport_->Release(k, t));
    }
  }
  for (int64_t step = 0; step < s_.steps(); ++step) {
    if (o_.cancelled != nullptr && o_.cancelled->load()) {
      transport_->Abort(absl::CancelledError("audit cancelled"));
      return absl::CancelledError("audit cancelled");
    }
    for (int64_t k = 0; k < world; ++k) {
      if (absl::Status st = StepA(k, step); !st.ok()) {
        transport_->Abort(st);
        return st;
      }
    }
    for (int64_t k = 0; k < world; ++k) {
      if (absl::Status st = StepB(k, step); !st.ok()) {
        transport_->Abort(st);
        return st;
      }
    }
  }
  // The protocol's bookkeeping ends with no credit or message in flight.
  ATTNAUDIT_RETURN_IF_ERROR(transport_->Drained());
  return Collect(out);
}

int64_t OwnerRank(const PreparedAttention& p, const CpSchedule& s, int64_t b,
                  int64_t unit, int64_t h) {
  if (s.strategy() == CpReplayStrategy::kRing) {
    return s.ItemOwner(b, h / p.dims.group());
  }
  return p.units[b][static_cast<size_t>(unit)].rank;
}

// Fetches every GPU's states and keeps, for each state, the copy of the
// GPU whose rank computed it.
absl::Status GpuReplay::AwaitRanks() {
  for (RankRuntime& r : ranks_) {
    ATTNAUDIT_CUDA_RETURN_IF_ERROR(cudaSetDevice(r.gpu->backend->device()));
    ATTNAUDIT_CUDA_RETURN_IF_ERROR(cudaEventRecord(r.end, r.stream));
  }
  if (gang_ == nullptr || gang_->size() <= 1) {
    for (RankRuntime& r : ranks_) {
      ATTNAUDIT_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(r.end));
    }
    return absl::OkStatus();
  }
  CollectiveWait wait;
  wait.what = absl::StrCat("cp ring over ", gang_->Names());
  wait.timeout = gang_->collective_timeout();
  wait.cancelled = o_.cancelled;
  return AwaitCollective(
      [this]() -> absl::StatusOr<bool> {
        for (RankRuntime& r : ranks_) {
          const cudaError_t e = cudaEventQuery(r.end);
          if (e == cudaErrorNotReady) return false;
          ATTNAUDIT_CUDA_RETURN_IF_ERROR(e);
        }
        return true;
      },
      [this] { return gang_->AsyncError(); }, [this] { gang_->Abort(); }, wait);
}

absl::Status GpuReplay::Collect(CpReplayRun* out) {
  const int64_t world = s_.world();
  out->rank_compute_seconds.assign(static_cast<size_t>(world), 0.0);
  out->rank_transport_seconds.assign(static_cast<size_t>(world), 0.0);
  ATTNAUDIT_RETURN_IF_ERROR(AwaitRanks());
  for (int64_t k = 0; k < world; ++k) {
    RankRuntime& r = ranks_[k];
    ATTNAUDIT_CUDA_RETURN_IF_ERROR(cudaSetDevice(r.gpu->backend->device()));
    float span = 0;
    ATTNAUDIT_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&span, r.begin, r.end));
    double compute = 0;
    for (size_t i = 0; i + 1 < r.marks.size(); i += 2) {
      float ms = 0;
      ATTNAUDIT_CUDA_RETURN_IF_ERROR(
          cudaEventElapsedTime(&ms, r.marks[i], r.marks[i + 1]));
      compute += ms * 1e-3;
    }
    if (r.marks.empty()) compute = span * 1e-3;
    out->rank_compute_seconds[k] = compute;
    out->rank_transport_seconds[k] = std::max(0.0, span * 1e-3 - compute);
  }
  for (GpuPart& g : gpus_) {
    CudaBackend& b = *g.backend;
    ATTNAUDIT_CUDA_RETURN_IF_ERROR(cudaSetDevice(b.device()));
    cudaStream_t st = b.stream();
    ATTNAUDIT_RETURN_IF_ERROR(b.staging().Download(
        g.host.p_out.data(), g.state_out,
        static_cast<int64_t>(g.host.p_out.size() * sizeof(float)), st));
    ATTNAUDIT_RETURN_IF_ERROR(b.staging().Download(
        g.host.p_lse.data(), g.state_lse,
        static_cast<int64_t>(g.host.p_lse.size() * sizeof(float)), st));
    int flag = 0;
    ATTNAUDIT_RETURN_IF_ERROR(
        b.staging().Download(&flag, g.kv_non_finite, sizeof(int), st));
    if (flag != 0) {
      return absl::InvalidArgumentError("run: a K/V value is not finite");
    }
  }
  UnitStates& states = out->states;
  states = std::move(gpus_[0].host);
  const int64_t g = static_cast<int64_t>(gpus_.size());
  if (g > 1) {
    const SnapshotDims& d = p_.dims;
    for (int64_t b = 0; b < d.batch; ++b) {
      for (int64_t u = 0; u < static_cast<int64_t>(p_.units[b].size()); ++u) {
        for (int64_t sq = 0; sq < d.queries; ++sq) {
          for (int64_t h = 0; h < d.q_heads; ++h) {
            const int64_t gpu = OwnerRank(p_, s_, b, u, h) % g;
            if (gpu == 0) continue;
            const int64_t i = states.Index(b, u, sq, h);
            std::copy_n(&gpus_[gpu].host.p_out[i * d.head_dim], d.head_dim,
                        &states.p_out[i * d.head_dim]);
            states.p_lse[i] = gpus_[gpu].host.p_lse[i];
          }
        }
      }
    }
  }
  out->execution = CpExecution::kLockstep;
  out->steps = s_.steps();
  out->rounds = s_.rounds();
  out->passes = static_cast<int64_t>(s_.passes().size());
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<CpReplayRun> CudaBackend::ReplayCp(
    const PreparedAttention& prepared, const CpSchedule& schedule,
    const CpReplayOptions& options) {
  const Clock::time_point start = Clock::now();
  std::vector<GpuPart> gpus;
  if (gang_ != nullptr && gang_->size() > 1) {
    for (int i = 0; i < gang_->size(); ++i) {
      GpuPart part;
      part.backend = gang_->member(i);
      gpus.push_back(std::move(part));
    }
  } else {
    GpuPart part;
    part.backend = this;
    gpus.push_back(std::move(part));
  }
  CpReplayRun run;
  absl::Status status;
  {
    GpuReplay replay(prepared, schedule, options, &gpus);
    status = replay.Run(gang_, &run);
  }  // streams drained and destroyed before the pools are reset
  for (GpuPart& g : gpus) {
    cudaSetDevice(g.backend->device());
    const absl::Status drained = cuda_internal::CudaStatus(
        cudaStreamSynchronize(g.backend->stream()), "cp replay end");
    g.backend->arena().Reset();
    if (status.ok()) status = drained;
  }
  if (!status.ok()) return status;
  run.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return run;
}

}  // namespace attnaudit
