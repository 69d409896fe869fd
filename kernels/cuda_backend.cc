// CudaBackend: device setup, the attention pass and the drift statistics.
// The CP replay is cuda_cp_replay.cc.
#include "kernels/cuda_backend.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/attention/unit_states.h"
#include "core/common/status_macros.h"
#include "kernels/attention_kernels.h"
#include "kernels/cuda_check.h"
#include "kernels/device_memory.h"
#include "kernels/device_snapshot.h"
#include "kernels/drift_kernels.h"
#include "kernels/math/split_merge.h"

namespace attnaudit {

using cuda_internal::DeviceArena;
using cuda_internal::PassParams;
using cuda_internal::PassRun;
using cuda_internal::PassUnit;
using cuda_internal::PinnedStaging;

namespace {

using Clock = std::chrono::steady_clock;

// The runs (one per logical block's page) and units of every row.
struct PoolRuns {
  std::vector<PassRun> runs;
  std::vector<PassUnit> units;
  std::vector<int32_t> row_runs;  // [B + 1]
};

PoolRuns PlanPoolRuns(const PreparedAttention& p) {
  const SnapshotDims& d = p.dims;
  const int64_t page_elems = d.page_size * d.kv_heads * d.head_dim;
  PoolRuns out;
  out.row_runs.push_back(0);
  for (int64_t b = 0; b < d.batch; ++b) {
    const int64_t L = p.layout->seq_lens[b];
    const int64_t blocks = (L + d.page_size - 1) / d.page_size;
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const int64_t page = p.layout->block_pages[b][blk];
      PassRun run;
      run.k_offset = page * page_elems * DTypeSize(p.k_dtype);
      run.v_offset = page * page_elems * DTypeSize(p.v_dtype);
      run.pos_offset = page * d.page_size;
      run.n =
          static_cast<int32_t>(std::min(d.page_size, L - blk * d.page_size));
      run.unit_begin = static_cast<int32_t>(out.units.size());
      for (int32_t u = p.block_unit_begin[b][blk];
           u < p.block_unit_begin[b][blk + 1]; ++u) {
        const KvUnit& unit = p.units[b][u];
        out.units.push_back({u, unit.first, unit.count, 0});
      }
      run.unit_end = static_cast<int32_t>(out.units.size());
      out.runs.push_back(run);
    }
    out.row_runs.push_back(static_cast<int32_t>(out.runs.size()));
  }
  return out;
}

// Device buffers of one pass's outputs.
struct PassOutputs {
  double* r_acc = nullptr;
  double* r_m = nullptr;
  double* r_l = nullptr;
  float* p_out = nullptr;
  float* p_lse = nullptr;
  float* p_state_out = nullptr;
  float* p_state_lse = nullptr;
  double* r_state_out = nullptr;
  double* r_state_lse = nullptr;
  int* kv_non_finite = nullptr;
  unsigned char* p_state_present = nullptr;
  // P's unit tree: the first phase's roots.
  float* tree_out = nullptr;
  float* tree_lse = nullptr;
  // Split-KV only: R's per-split states.
  double* r_part_acc = nullptr;
  double* r_part_m = nullptr;
  double* r_part_l = nullptr;
};

// The unit tree's first phase: blocks of `block` units, `blocks` a query
// (kmath::TreeBlockUnits of the most units a row has).
struct TreeShape {
  int64_t block = 1;
  int64_t blocks = 1;
};

TreeShape TreeShapeOf(const PreparedAttention& p) {
  int64_t most = 0;
  for (const auto& row : p.units) {
    most = std::max<int64_t>(most, static_cast<int64_t>(row.size()));
  }
  TreeShape t;
  t.block = kmath::TreeBlockUnits(most);
  t.blocks = std::max<int64_t>(1, (most + t.block - 1) / t.block);
  return t;
}

int64_t TotalUnits(const PreparedAttention& p) {
  int64_t n = 0;
  for (const auto& row : p.units) n += static_cast<int64_t>(row.size());
  return n;
}

// What one pass must produce, whatever shape the launch takes.
struct PassWants {
  bool reference = false;
  bool replay = false;
};

// R's per-split states of a split-KV pass.
absl::Status AllocateSplitOutputs(const PreparedAttention& p,
                                  const PassParams& params, DeviceArena& arena,
                                  PassOutputs* o) {
  const SnapshotDims& d = p.dims;
  const int64_t parts = params.splits * d.batch * d.queries * d.q_heads;
  if (params.reference) {
    ATTNAUDIT_ASSIGN_OR_RETURN(
        o->r_part_acc,
        arena.AllocateArray<double>(parts * d.head_dim, "R split states"));
    ATTNAUDIT_ASSIGN_OR_RETURN(
        o->r_part_m, arena.AllocateArray<double>(parts, "R split states"));
    ATTNAUDIT_ASSIGN_OR_RETURN(
        o->r_part_l, arena.AllocateArray<double>(parts, "R split states"));
  }
  return absl::OkStatus();
}

// P's unit states' presence flags and the unit tree's first-phase roots.
absl::Status AllocateTreeOutputs(const PreparedAttention& p, DeviceArena& arena,
                                 cudaStream_t stream, PassOutputs* o) {
  const SnapshotDims& d = p.dims;
  const int64_t states = TotalUnits(p) * d.queries * d.q_heads;
  ATTNAUDIT_ASSIGN_OR_RETURN(
      o->p_state_present,
      arena.AllocateArray<unsigned char>(states, "P unit flags"));
  ATTNAUDIT_CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(o->p_state_present, 0, states, stream));
  const int64_t roots = d.batch * d.queries * d.q_heads * TreeShapeOf(p).blocks;
  ATTNAUDIT_ASSIGN_OR_RETURN(
      o->tree_out,
      arena.AllocateArray<float>(roots * d.head_dim, "P unit tree roots"));
  ATTNAUDIT_ASSIGN_OR_RETURN(
      o->tree_lse, arena.AllocateArray<float>(roots, "P unit tree roots"));
  return absl::OkStatus();
}

absl::StatusOr<PassOutputs> AllocateOutputs(const PreparedAttention& p,
                                            const PassParams& params,
                                            const PassWants& wants,
                                            DeviceArena& arena,
                                            cudaStream_t stream) {
  const SnapshotDims& d = p.dims;
  const int64_t queries = d.batch * d.queries * d.q_heads;
  const int64_t states = TotalUnits(p) * d.queries * d.q_heads;
  PassOutputs o;
  if (params.splits > 1) {
    ATTNAUDIT_RETURN_IF_ERROR(AllocateSplitOutputs(p, params, arena, &o));
  }
  if (params.store_p_states) {
    ATTNAUDIT_RETURN_IF_ERROR(AllocateTreeOutputs(p, arena, stream, &o));
  }
  if (wants.reference) {
    ATTNAUDIT_ASSIGN_OR_RETURN(
        o.r_acc, arena.AllocateArray<double>(queries * d.head_dim, "R"));
    ATTNAUDIT_ASSIGN_OR_RETURN(o.r_m,
                               arena.AllocateArray<double>(queries, "R"));
    ATTNAUDIT_ASSIGN_OR_RETURN(o.r_l,
                               arena.AllocateArray<double>(queries, "R"));
  }
  if (wants.replay) {
    ATTNAUDIT_ASSIGN_OR_RETURN(
        o.p_out, arena.AllocateArray<float>(queries * d.head_dim, "P"));
    ATTNAUDIT_ASSIGN_OR_RETURN(o.p_lse,
                               arena.AllocateArray<float>(queries, "P"));
  }
  if (params.store_p_states) {
    ATTNAUDIT_ASSIGN_OR_RETURN(
        o.p_state_out,
        arena.AllocateArray<float>(states * d.head_dim, "P unit states"));
    ATTNAUDIT_ASSIGN_OR_RETURN(
        o.p_state_lse, arena.AllocateArray<float>(states, "P unit states"));
  }
  if (params.store_r_states) {
    ATTNAUDIT_ASSIGN_OR_RETURN(
        o.r_state_out,
        arena.AllocateArray<double>(states * d.head_dim, "R unit states"));
    ATTNAUDIT_ASSIGN_OR_RETURN(
        o.r_state_lse, arena.AllocateArray<double>(states, "R unit states"));
  }
  ATTNAUDIT_ASSIGN_OR_RETURN(o.kv_non_finite,
                             arena.AllocateArray<int>(1, "a flag"));
  ATTNAUDIT_CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(o.kv_non_finite, 0, sizeof(int), stream));
  return o;
}

// The stored unit states start as UnitStates::Reset leaves them (out 0,
// lse -inf): units no query sees are never written.
absl::Status ResetStates(UnitStates& host, const PassOutputs& o,
                         PinnedStaging& staging, cudaStream_t stream) {
  if (o.p_state_out != nullptr) {
    ATTNAUDIT_RETURN_IF_ERROR(staging.Upload(
        o.p_state_out, host.p_out.data(),
        static_cast<int64_t>(host.p_out.size() * sizeof(float)), stream));
    ATTNAUDIT_RETURN_IF_ERROR(staging.Upload(
        o.p_state_lse, host.p_lse.data(),
        static_cast<int64_t>(host.p_lse.size() * sizeof(float)), stream));
  }
  if (o.r_state_out != nullptr) {
    ATTNAUDIT_RETURN_IF_ERROR(staging.Upload(
        o.r_state_out, host.r_out.data(),
        static_cast<int64_t>(host.r_out.size() * sizeof(double)), stream));
    ATTNAUDIT_RETURN_IF_ERROR(staging.Upload(
        o.r_state_lse, host.r_lse.data(),
        static_cast<int64_t>(host.r_lse.size() * sizeof(double)), stream));
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status Fetch(std::vector<T>* host, const T* device, int64_t count,
                   PinnedStaging& staging, cudaStream_t stream) {
  host->resize(static_cast<size_t>(count));
  return staging.Download(host->data(), device,
                          count * static_cast<int64_t>(sizeof(T)), stream);
}

// Finishes R and P on the host with the core's final-write functions.
absl::Status FinishOutputs(const PreparedAttention& p, const PassWants& wants,
                           const PassOutputs& o, PinnedStaging& staging,
                           cudaStream_t stream, AttentionResults* res) {
  const SnapshotDims& d = p.dims;
  const int64_t queries = d.batch * d.queries * d.q_heads;
  const int64_t D = d.head_dim;
  std::vector<double> r_acc, r_m, r_l;
  std::vector<float> p_out, p_lse;
  if (wants.reference) {
    ATTNAUDIT_RETURN_IF_ERROR(
        Fetch(&r_acc, o.r_acc, queries * D, staging, stream));
    ATTNAUDIT_RETURN_IF_ERROR(Fetch(&r_m, o.r_m, queries, staging, stream));
    ATTNAUDIT_RETURN_IF_ERROR(Fetch(&r_l, o.r_l, queries, staging, stream));
  }
  if (wants.replay) {
    ATTNAUDIT_RETURN_IF_ERROR(
        Fetch(&p_out, o.p_out, queries * D, staging, stream));
    ATTNAUDIT_RETURN_IF_ERROR(Fetch(&p_lse, o.p_lse, queries, staging, stream));
  }
  for (int64_t qi = 0; qi < queries; ++qi) {
    const int64_t h = qi % d.q_heads;
    if (wants.reference) {
      FinishReferenceState(p, h, &r_acc[qi * D], r_m[qi], r_l[qi],
                           &res->reference_out[qi * D],
                           &res->reference_lse[qi]);
    }
    if (wants.replay) {
      FinishReplayState(p, h, &p_out[qi * D], p_lse[qi],
                        &res->replay_out[qi * D], &res->replay_lse[qi]);
    }
  }
  return absl::OkStatus();
}

absl::Status FetchStates(const PassOutputs& o, PinnedStaging& staging,
                         cudaStream_t stream, UnitStates* states) {
  if (o.p_state_out != nullptr) {
    ATTNAUDIT_RETURN_IF_ERROR(staging.Download(
        states->p_out.data(), o.p_state_out,
        static_cast<int64_t>(states->p_out.size() * sizeof(float)), stream));
    ATTNAUDIT_RETURN_IF_ERROR(staging.Download(
        states->p_lse.data(), o.p_state_lse,
        static_cast<int64_t>(states->p_lse.size() * sizeof(float)), stream));
  }
  if (o.r_state_out != nullptr) {
    ATTNAUDIT_RETURN_IF_ERROR(staging.Download(
        states->r_out.data(), o.r_state_out,
        static_cast<int64_t>(states->r_out.size() * sizeof(double)), stream));
    ATTNAUDIT_RETURN_IF_ERROR(staging.Download(
        states->r_lse.data(), o.r_state_lse,
        static_cast<int64_t>(states->r_lse.size() * sizeof(double)), stream));
  }
  return absl::OkStatus();
}

double ElapsedSeconds(cudaEvent_t a, cudaEvent_t b) {
  float ms = 0;
  return cudaEventElapsedTime(&ms, a, b) == cudaSuccess ? ms * 1e-3 : 0.0;
}

// Points the kernel's output arguments at the buffers AllocateOutputs made
// (a split-KV pass writes R per split).
void BindOutputs(const PassOutputs& out, PassParams* params) {
  const bool split = params->splits > 1;
  params->r_acc = split ? out.r_part_acc : out.r_acc;
  params->r_m = split ? out.r_part_m : out.r_m;
  params->r_l = split ? out.r_part_l : out.r_l;
  params->p_state_present = out.p_state_present;
  params->p_state_out = out.p_state_out;
  params->p_state_lse = out.p_state_lse;
  params->r_state_out = out.r_state_out;
  params->r_state_lse = out.r_state_lse;
  params->kv_non_finite = out.kv_non_finite;
}

// Split-KV when one block per (row, KV head, query chunk) would leave the
// device's multiprocessors idle: R is stored per split (the second step
// combines it). Not when those states would take more than half of the
// pool's free bytes: the one-block pass gives the same P, and a snapshot
// that fits it must not fall back to the CPU for the split's sake.
void PlanSplits(const PoolRuns& plan, int multiprocessors, int64_t max_splits,
                int64_t free_bytes, PassParams* params) {
  const int64_t chunks = (params->queries + params->queries_per_block - 1) /
                         params->queries_per_block;
  int64_t max_row_runs = 0;
  for (size_t b = 0; b + 1 < plan.row_runs.size(); ++b) {
    max_row_runs = std::max<int64_t>(max_row_runs,
                                     plan.row_runs[b + 1] - plan.row_runs[b]);
  }
  // About eight blocks per multiprocessor: several waves of those that fit
  // at once, so uneven rows leave a short tail.
  params->splits = kmath::SplitsFor(
      params->rows * params->kv_heads * chunks * params->head_tiles,
      max_row_runs, 8 * int64_t{multiprocessors});
  if (max_splits > 0) params->splits = std::min(params->splits, max_splits);
  if (params->splits <= 1) return;
  const int64_t extra = kmath::SplitExtraBytes(
      params->splits, params->rows * params->queries * params->q_heads,
      params->head_dim, params->reference != 0);
  if (extra > free_bytes / 2) {
    params->splits = 1;
    return;
  }
  // Query indices count from row 0, whatever row_begin.
  params->r_split_stride =
      (params->row_begin + params->rows) * params->queries * params->q_heads;
}

// The pass's second step into the final buffers: P's unit tree and,
// split-KV, R's split combine.
absl::Status MergeSplits(const PreparedAttention& p, const PassParams& params,
                         const PassWants& wants, const PassOutputs& out,
                         cudaStream_t stream) {
  cuda_internal::SplitMergeParams m;
  m.row_begin = params.row_begin;
  m.rows = params.rows;
  m.queries = params.queries;
  m.q_heads = params.q_heads;
  m.head_dim = params.head_dim;
  if (wants.replay) {
    m.unit_base = params.unit_base;
    m.p_state_out = out.p_state_out;
    m.p_state_lse = out.p_state_lse;
    m.p_state_present = out.p_state_present;
    m.p_out = out.p_out;
    m.p_lse = out.p_lse;
    const TreeShape tree = TreeShapeOf(p);
    m.tree_block = tree.block;
    m.tree_blocks = tree.blocks;
    m.tree_out = out.tree_out;
    m.tree_lse = out.tree_lse;
  }
  if (wants.reference && params.splits > 1) {
    m.splits = params.splits;
    m.r_split_stride = params.r_split_stride;
    m.r_part_acc = out.r_part_acc;
    m.r_part_m = out.r_part_m;
    m.r_part_l = out.r_part_l;
    m.r_acc = out.r_acc;
    m.r_m = out.r_m;
    m.r_l = out.r_l;
  }
  return cuda_internal::LaunchSplitMerge(m, stream);
}

// Timing events on a stream (upload, pass, merge, download), destroyed
// with the object.
struct PhaseEvents {
  cudaEvent_t e[5] = {nullptr, nullptr, nullptr, nullptr, nullptr};
  absl::Status Create() {
    for (cudaEvent_t& x : e)
      ATTNAUDIT_CUDA_RETURN_IF_ERROR(cudaEventCreate(&x));
    return absl::OkStatus();
  }
  ~PhaseEvents() {
    for (cudaEvent_t x : e) {
      if (x != nullptr) cudaEventDestroy(x);
    }
  }
};

}  // namespace

absl::StatusOr<std::vector<CudaDeviceInfo>> ListCudaDevices() {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    cudaGetLastError();  // not sticky: clear it
    return absl::UnavailableError(absl::StrCat(
        "no usable GPU: cudaGetDeviceCount: ", cudaGetErrorName(error), " (",
        cudaGetErrorString(error), ")"));
  }
  if (count == 0) return absl::UnavailableError("no usable GPU: no device");
  std::vector<CudaDeviceInfo> out;
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop;
    ATTNAUDIT_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, i));
    CudaDeviceInfo info;
    info.ordinal = i;
    info.name = prop.name;
    info.memory_bytes = static_cast<int64_t>(prop.totalGlobalMem);
    info.compute_major = prop.major;
    info.compute_minor = prop.minor;
    out.push_back(std::move(info));
  }
  return out;
}

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(
    const CudaBackendOptions& options) {
  ATTNAUDIT_ASSIGN_OR_RETURN(std::vector<CudaDeviceInfo> devices,
                             ListCudaDevices());
  if (options.device < 0 ||
      options.device >= static_cast<int>(devices.size())) {
    return absl::UnavailableError(
        absl::StrCat("cuda:", options.device, " does not exist (",
                     devices.size(), " GPUs visible)"));
  }
  std::unique_ptr<CudaBackend> b(new CudaBackend());
  b->info_ = devices[options.device];
  b->max_splits_ = options.max_splits;
  b->max_stage_runs_ = options.max_stage_runs;
  b->shard_uploads_ = options.shard_uploads;
  ATTNAUDIT_CUDA_RETURN_IF_ERROR(cudaSetDevice(options.device));
  ATTNAUDIT_CUDA_RETURN_IF_ERROR(
      cudaStreamCreateWithFlags(&b->stream_, cudaStreamNonBlocking));
  int64_t pool = options.pool_bytes;
  if (pool <= 0) {
    size_t free_bytes = 0;
    size_t total_bytes = 0;
    ATTNAUDIT_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
    pool = static_cast<int64_t>(free_bytes / 4 * 3);
  }
  ATTNAUDIT_ASSIGN_OR_RETURN(b->arena_, DeviceArena::Create(pool));
  ATTNAUDIT_ASSIGN_OR_RETURN(
      b->staging_,
      PinnedStaging::Create(options.staging_bytes, options.host_copy_threads));
  return b;
}

CudaBackend::~CudaBackend() {
  if (stream_ != nullptr) {
    cudaSetDevice(info_.ordinal);
    cudaStreamSynchronize(stream_);
    staging_.reset();
    arena_.reset();
    cudaStreamDestroy(stream_);
  }
}

std::string CudaBackend::name() const {
  return absl::StrCat("cuda:", info_.ordinal);
}

int64_t CudaBackend::memory_in_use() const {
  return (arena_ == nullptr ? 0 : arena_->used()) + comm_memory();
}

absl::Status CudaBackend::ContextHealth() const {
  // A sticky error is returned by every call after it; a synchronise is
  // the call that also reports one raised by a kernel still in flight.
  cudaError_t error = cudaSetDevice(info_.ordinal);
  if (error == cudaSuccess) error = cudaStreamSynchronize(stream_);
  if (!cuda_internal::IsStickyError(error)) return absl::OkStatus();
  return cuda_internal::CudaStatus(error, "device health check");
}

absl::StatusOr<AttentionResults> CudaBackend::ComputeAttention(
    const PreparedAttention& p, const AttentionRunOptions& options) {
  if (options.cancelled != nullptr && options.cancelled->load()) {
    return absl::CancelledError("audit cancelled");
  }
  ATTNAUDIT_CUDA_RETURN_IF_ERROR(cudaSetDevice(info_.ordinal));
  arena_->Reset();
  absl::StatusOr<AttentionResults> res = RunAttention(p, options);
  // Whatever happened, nothing may still run on the pool before the next
  // job reuses it.
  const absl::Status drained =
      cuda_internal::CudaStatus(cudaStreamSynchronize(stream_), "job end");
  arena_->Reset();
  if (!drained.ok()) return drained;
  return res;
}

absl::StatusOr<AttentionResults> CudaBackend::RunAttention(
    const PreparedAttention& p, const AttentionRunOptions& options) {
  const Clock::time_point start = Clock::now();
  const SnapshotDims& d = p.dims;
  PhaseEvents ev;
  ATTNAUDIT_RETURN_IF_ERROR(ev.Create());
  ATTNAUDIT_CUDA_RETURN_IF_ERROR(cudaEventRecord(ev.e[0], stream_));
  ATTNAUDIT_ASSIGN_OR_RETURN(
      cuda_internal::DeviceSnapshot snap,
      cuda_internal::UploadSnapshot(p, *arena_, *staging_, stream_));
  const PoolRuns plan = PlanPoolRuns(p);
  PassParams params = cuda_internal::BaseParams(p, snap);
  params.rows = d.batch;
  PassWants wants;
  wants.reference = options.passes != AttentionPasses::kReplayOnly;
  wants.replay = options.passes != AttentionPasses::kReferenceOnly;
  params.reference = wants.reference;
  UnitStates* states = options.unit_states;
  params.store_p_states = wants.replay || states != nullptr ? 1 : 0;
  params.store_r_states = states != nullptr && states->has_reference ? 1 : 0;
  int max_shared = 0;
  ATTNAUDIT_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(
      &max_shared, cudaDevAttrMaxSharedMemoryPerBlockOptin, info_.ordinal));
  if (!cuda_internal::FitPassToSharedMemory(&params, max_shared,
                                            max_stage_runs_)) {
    return absl::UnimplementedError(absl::StrCat(
        "cuda: a page of ", d.page_size, " tokens x head dim ", d.head_dim,
        " does not fit one thread block's shared memory (", max_shared,
        " bytes)"));
  }
  int multiprocessors = 0;
  ATTNAUDIT_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(
      &multiprocessors, cudaDevAttrMultiProcessorCount, info_.ordinal));
  PlanSplits(plan, multiprocessors, max_splits_,
             arena_->capacity() - arena_->used(), &params);
  ATTNAUDIT_ASSIGN_OR_RETURN(
      params.runs,
      UploadVector(plan.runs, "runs", *arena_, *staging_, stream_));
  ATTNAUDIT_ASSIGN_OR_RETURN(
      params.units,
      UploadVector(plan.units, "units", *arena_, *staging_, stream_));
  ATTNAUDIT_ASSIGN_OR_RETURN(
      params.row_runs,
      UploadVector(plan.row_runs, "row runs", *arena_, *staging_, stream_));
  ATTNAUDIT_ASSIGN_OR_RETURN(
      PassOutputs out, AllocateOutputs(p, params, wants, *arena_, stream_));
  if (states != nullptr) {
    states->Reset(p.units, d, states->has_reference);
    ATTNAUDIT_RETURN_IF_ERROR(ResetStates(*states, out, *staging_, stream_));
  }
  BindOutputs(out, &params);
  ATTNAUDIT_CUDA_RETURN_IF_ERROR(cudaEventRecord(ev.e[1], stream_));
  ATTNAUDIT_RETURN_IF_ERROR(cuda_internal::LaunchFusedPass(params, stream_));
  ATTNAUDIT_CUDA_RETURN_IF_ERROR(cudaEventRecord(ev.e[4], stream_));
  if (wants.replay || params.splits > 1) {
    ATTNAUDIT_RETURN_IF_ERROR(MergeSplits(p, params, wants, out, stream_));
  }
  ATTNAUDIT_CUDA_RETURN_IF_ERROR(cudaEventRecord(ev.e[2], stream_));

  AttentionResults res;
  const size_t n_out =
      static_cast<size_t>(d.batch * d.queries * d.q_heads * d.head_dim);
  const size_t n_lse = static_cast<size_t>(d.batch * d.queries * d.q_heads);
  res.reference_out.assign(n_out, 0.0);
  res.replay_out.assign(n_out, 0.0);
  res.reference_lse.assign(n_lse, 0.0);
  res.replay_lse.assign(n_lse, 0.0);
  ATTNAUDIT_RETURN_IF_ERROR(
      FinishOutputs(p, wants, out, *staging_, stream_, &res));
  if (states != nullptr) {
    ATTNAUDIT_RETURN_IF_ERROR(FetchStates(out, *staging_, stream_, states));
  }
  int flag = 0;
  ATTNAUDIT_RETURN_IF_ERROR(
      staging_->Download(&flag, out.kv_non_finite, sizeof(int), stream_));
  ATTNAUDIT_CUDA_RETURN_IF_ERROR(cudaEventRecord(ev.e[3], stream_));
  ATTNAUDIT_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(ev.e[3]));
  timings_.upload_seconds = ElapsedSeconds(ev.e[0], ev.e[1]);
  timings_.kernel_seconds = ElapsedSeconds(ev.e[1], ev.e[2]);
  timings_.merge_seconds = ElapsedSeconds(ev.e[4], ev.e[2]);
  timings_.splits = params.splits;
  timings_.stage_runs = params.runs_per_stage;
  timings_.head_tiles = params.head_tiles;
  timings_.download_seconds = ElapsedSeconds(ev.e[2], ev.e[3]);
  res.kv_non_finite = flag != 0;
  SummariseUnits(p, options.record_merge_orders, &res);
  res.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return res;
}

}  // namespace attnaudit
