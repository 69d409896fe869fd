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
#include "kernels/pass_plan.h"

namespace attnaudit {

using cuda_internal::BindOutputs;
using cuda_internal::CountPassOutputs;
using cuda_internal::DeviceArena;
using cuda_internal::FinishPassOutputs;
using cuda_internal::MergeParamsOf;
using cuda_internal::PassOutputCounts;
using cuda_internal::PassOutputs;
using cuda_internal::PassParams;
using cuda_internal::PassWants;
using cuda_internal::PinnedStaging;
using cuda_internal::PlanPoolRuns;
using cuda_internal::PoolRuns;

namespace {

using Clock = std::chrono::steady_clock;

// The pass's buffers in the arena, as CountPassOutputs sizes them; the
// flags start at 0.
absl::StatusOr<PassOutputs> AllocateOutputs(const PreparedAttention& p,
                                            const PassParams& params,
                                            const PassWants& wants,
                                            DeviceArena& arena,
                                            cudaStream_t stream) {
  const int64_t D = p.dims.head_dim;
  const PassOutputCounts n = CountPassOutputs(p, params);
  PassOutputs o;
  if (n.r_parts > 0) {
    ATTNAUDIT_ASSIGN_OR_RETURN(
        o.r_part_acc, arena.AllocateArray<double>(n.r_parts * D, "R splits"));
    ATTNAUDIT_ASSIGN_OR_RETURN(
        o.r_part_m, arena.AllocateArray<double>(n.r_parts, "R splits"));
    ATTNAUDIT_ASSIGN_OR_RETURN(
        o.r_part_l, arena.AllocateArray<double>(n.r_parts, "R splits"));
  }
  if (params.store_p_states) {
    ATTNAUDIT_ASSIGN_OR_RETURN(
        o.p_state_present,
        arena.AllocateArray<unsigned char>(n.states, "P unit flags"));
    ATTNAUDIT_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(o.p_state_present, 0, n.states, stream));
    ATTNAUDIT_ASSIGN_OR_RETURN(
        o.tree_out,
        arena.AllocateArray<float>(n.tree_roots * D, "P unit tree roots"));
    ATTNAUDIT_ASSIGN_OR_RETURN(
        o.tree_lse,
        arena.AllocateArray<float>(n.tree_roots, "P unit tree roots"));
    ATTNAUDIT_ASSIGN_OR_RETURN(
        o.p_state_out,
        arena.AllocateArray<float>(n.states * D, "P unit states"));
    ATTNAUDIT_ASSIGN_OR_RETURN(
        o.p_state_lse, arena.AllocateArray<float>(n.states, "P unit states"));
  }
  if (wants.reference) {
    ATTNAUDIT_ASSIGN_OR_RETURN(o.r_acc,
                               arena.AllocateArray<double>(n.queries * D, "R"));
    ATTNAUDIT_ASSIGN_OR_RETURN(o.r_m,
                               arena.AllocateArray<double>(n.queries, "R"));
    ATTNAUDIT_ASSIGN_OR_RETURN(o.r_l,
                               arena.AllocateArray<double>(n.queries, "R"));
  }
  if (wants.replay) {
    ATTNAUDIT_ASSIGN_OR_RETURN(o.p_out,
                               arena.AllocateArray<float>(n.queries * D, "P"));
    ATTNAUDIT_ASSIGN_OR_RETURN(o.p_lse,
                               arena.AllocateArray<float>(n.queries, "P"));
  }
  if (params.store_r_states) {
    ATTNAUDIT_ASSIGN_OR_RETURN(
        o.r_state_out,
        arena.AllocateArray<double>(n.states * D, "R unit states"));
    ATTNAUDIT_ASSIGN_OR_RETURN(
        o.r_state_lse, arena.AllocateArray<double>(n.states, "R unit states"));
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
  FinishPassOutputs(p, wants, r_acc.data(), r_m.data(), r_l.data(),
                    p_out.data(), p_lse.data(), res);
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

// The pass's second step into the final buffers: P's unit tree and,
// split-KV, R's split combine.
absl::Status MergeSplits(const PreparedAttention& p, const PassParams& params,
                         const PassWants& wants, const PassOutputs& out,
                         bool tree_every_level, cudaStream_t stream) {
  cuda_internal::SplitMergeParams m = MergeParamsOf(p, params, wants, out);
  m.tree_every_level = tree_every_level ? 1 : 0;
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
  b->specialized_kernels_ = options.specialized_kernels;
  b->unit_tree_every_level_ = options.unit_tree_every_level;
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

int64_t CudaBackend::pool_capacity() const {
  return arena_ == nullptr ? 0 : arena_->capacity();
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
  int max_shared = 0;
  int multiprocessors = 0;
  ATTNAUDIT_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(
      &max_shared, cudaDevAttrMaxSharedMemoryPerBlockOptin, info_.ordinal));
  ATTNAUDIT_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(
      &multiprocessors, cudaDevAttrMultiProcessorCount, info_.ordinal));
  cuda_internal::PassDevice device;
  device.max_shared = max_shared;
  device.multiprocessors = multiprocessors;
  device.free_bytes = arena_->capacity() - arena_->used();
  device.max_splits = max_splits_;
  device.max_stage_runs = max_stage_runs_;
  device.specialized = specialized_kernels_;
  UnitStates* states = options.unit_states;
  PassParams params;
  PassWants wants;
  if (!cuda_internal::PlanPoolPass(p, snap, plan, options.passes,
                                   states != nullptr,
                                   states != nullptr && states->has_reference,
                                   device, &params, &wants)) {
    return absl::UnimplementedError(absl::StrCat(
        "cuda: a page of ", d.page_size, " tokens x head dim ", d.head_dim,
        " does not fit one thread block's shared memory (", max_shared,
        " bytes)"));
  }
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
  bool specialized = false;
  ATTNAUDIT_RETURN_IF_ERROR(
      cuda_internal::LaunchFusedPass(params, stream_, &specialized));
  ATTNAUDIT_CUDA_RETURN_IF_ERROR(cudaEventRecord(ev.e[4], stream_));
  if (wants.replay || params.splits > 1) {
    ATTNAUDIT_RETURN_IF_ERROR(
        MergeSplits(p, params, wants, out, unit_tree_every_level_, stream_));
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
  timings_.specialized = specialized;
  timings_.download_seconds = ElapsedSeconds(ev.e[2], ev.e[3]);
  res.kv_non_finite = flag != 0;
  SummariseUnits(p, options.record_merge_orders, &res);
  res.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return res;
}

}  // namespace attnaudit
