// CudaBackend: the Backend (core/backend/backend.h) on one NVIDIA GPU.
//
//   ATTNAUDIT_ASSIGN_OR_RETURN(std::unique_ptr<CudaBackend> gpu,
//                              CudaBackend::Create({.device = 0}));
//   AuditOptions options;  options.backend = gpu.get();
//   RunAudit(snapshot, options);
//
// What runs where. ComputeAttention uploads the prepared snapshot (the
// referenced KV pages, positions, RoPE'd queries, scales, the unit plan)
// through pinned staging buffers, runs the fused R + P kernel
// (kernels/attention_kernels.h) and brings back the unfinished states, which
// the host finishes with the core's own final-write functions. ReplayCp
// runs the CP schedule with every rank as a CUDA stream of this GPU and
// the CUDA-local transport (device-to-device copies), or, on a CudaGang,
// rank k on GPU k mod G with the NCCL transport. ComputeDrift reduces the
// statistics on the device; only the numbers come back.
//
// Resources. One CUDA stream per backend, used by one job at a time (the
// job's stream); a device memory pool of `pool_bytes`, reset after every
// job; two pinned staging buffers of `staging_bytes`, reused across jobs,
// filled and emptied by `host_copy_threads` threads.
// A job larger than the pool fails ResourceExhausted (the server's
// CudaDevice then runs it on the CPU backend, through FallbackBackend).
//
// Numerics: docs/NUMERICS.md, "CPU and GPU". P has the CPU's bits (the
// kernels run the core's operations in its order, with the core's own exp
// and log, no math library); R within 1e-12 relative of the CPU's; the
// drift statistics the CPU's but for the sums' last bits.
//
// Thread safety: name()/info()/memory_in_use() from any thread; the
// Backend calls from one thread at a time. Errors: as Backend; CUDA and
// NCCL errors become statuses (kernels/cuda_check.h); nothing exits.
#ifndef ATTNAUDIT_KERNELS_CUDA_BACKEND_H_
#define ATTNAUDIT_KERNELS_CUDA_BACKEND_H_

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/backend/backend.h"

namespace attnaudit {

namespace cuda_internal {
class DeviceArena;
class PinnedStaging;
}  // namespace cuda_internal

struct CudaDeviceInfo {
  int ordinal = 0;
  std::string name;  // "NVIDIA H200"
  int64_t memory_bytes = 0;
  int compute_major = 0;
  int compute_minor = 0;
};

// The visible GPUs. Unavailable with the driver's reason when there is
// none (no device, no driver, a driver too old for this build).
absl::StatusOr<std::vector<CudaDeviceInfo>> ListCudaDevices();

struct CudaBackendOptions {
  int device = 0;
  // The device memory pool; 0: three quarters of the device's free memory
  // at Create.
  int64_t pool_bytes = 0;
  // Each of the two pinned staging buffers.
  int64_t staging_bytes = int64_t{16} << 20;
  // Threads that copy between the host's memory and the staging buffers
  // (the job's host threads; <= 0: every hardware thread).
  int host_copy_threads = 1;
  // Most thread blocks per row along its runs (split-KV); 0: as many as
  // fill the device, 1: the one-block pass. The results are the same P
  // bits either way (docs/NUMERICS.md, "CPU and GPU").
  int64_t max_splits = 0;
  // Most runs (pages) a thread block reads and computes as one stage; 0: as
  // many as FitPassToSharedMemory allows, 1: one run at a time. The same
  // bits either way.
  int64_t max_stage_runs = 0;
  // Run the pass's kernel built for the snapshot's head dim and cache
  // dtype when there is one (kernels/attention_device.inc,
  // kSpecializedPasses); false: always the generic kernel. The same bits
  // either way.
  bool specialized_kernels = true;
  // The second step's unit tree walks every level of a leaf's carry with
  // the level as a constant (in registers, at more registers a thread)
  // instead of the levels the carry needs (in local memory). The same
  // bits; which is faster is for a GPU to measure (docs/perf-history.md).
  bool unit_tree_every_level = false;
  // A CP replay over a gang of several GPUs uploads to each GPU only the
  // pages its ranks start the ring with (kernels/shard_pages.h); true does
  // so on one GPU too (tests: the shard path on a one-GPU machine).
  bool shard_uploads = false;
};

// Seconds of the last ComputeAttention, by phase (events on the stream).
struct CudaJobTimings {
  double upload_seconds = 0;
  double kernel_seconds = 0;  // the pass and its second step
  double merge_seconds = 0;   // of kernel_seconds: the second step (P's unit
                              // tree, R's split combine)
  int64_t splits = 1;         // blocks per row along its runs
  int64_t stage_runs = 1;     // runs per stage of the pass
  int64_t head_tiles = 1;     // blocks per GQA group (1: the whole group)
  bool specialized = false;   // the kernel built for the shape ran
  double download_seconds = 0;
};

class CudaGang;  // kernels/cuda_gang.h

class CudaBackend : public Backend {
 public:
  // Unavailable when the device does not exist; ResourceExhausted when the
  // pool or the staging buffers cannot be allocated.
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(
      const CudaBackendOptions& options);
  ~CudaBackend() override;

  std::string name() const override;
  // One call at a time: one stream and one device pool per backend.
  BackendCapabilities capabilities() const override { return {}; }
  absl::StatusOr<AttentionResults> ComputeAttention(
      const PreparedAttention& prepared,
      const AttentionRunOptions& options) override;
  absl::StatusOr<CpReplayRun> ReplayCp(const PreparedAttention& prepared,
                                       const CpSchedule& schedule,
                                       const CpReplayOptions& options) override;
  absl::StatusOr<DriftStats> ComputeDrift(const DenseView& candidate,
                                          const DenseView& baseline,
                                          const DriftOptions& options) override;

  const CudaDeviceInfo& info() const { return info_; }
  // Device bytes held: the pool's bytes the running job holds (0 between
  // jobs) plus comm_memory().
  int64_t memory_in_use() const;
  // Device bytes outside the pool held by the NCCL communicators of the
  // gangs this GPU is a member of (each CudaGang adds its share when it is
  // made and takes it back when it is destroyed). Thread-safe.
  int64_t comm_memory() const {
    return comm_bytes_.load(std::memory_order_relaxed);
  }
  void AddCommMemory(int64_t delta) {
    comm_bytes_.fetch_add(delta, std::memory_order_relaxed);
  }
  // OK while the device's context is usable; the sticky error once it is
  // not (cuda_check.h). Waits for the backend's stream: call it between
  // jobs. Thread-safe.
  absl::Status ContextHealth() const;
  CudaJobTimings last_timings() const { return timings_; }

  // The ring of ReplayCp runs over `gang` (this backend must be its
  // member 0) until SetGang(nullptr). Not owned.
  void SetGang(CudaGang* gang) { gang_ = gang; }

  // Internal to kernels/: what the CP replay and the gang use.
  int device() const { return info_.ordinal; }
  cudaStream_t stream() const { return stream_; }
  cuda_internal::DeviceArena& arena() { return *arena_; }
  cuda_internal::PinnedStaging& staging() { return *staging_; }
  bool shard_uploads() const { return shard_uploads_; }
  bool specialized_kernels() const { return specialized_kernels_; }
  // Bytes of the device memory pool (what one job may use).
  int64_t pool_capacity() const;

 private:
  CudaBackend() = default;
  absl::StatusOr<AttentionResults> RunAttention(
      const PreparedAttention& prepared, const AttentionRunOptions& options);

  CudaDeviceInfo info_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<cuda_internal::DeviceArena> arena_;
  std::unique_ptr<cuda_internal::PinnedStaging> staging_;
  CudaJobTimings timings_;
  int64_t max_splits_ = 0;
  int64_t max_stage_runs_ = 0;
  bool shard_uploads_ = false;
  bool specialized_kernels_ = true;
  bool unit_tree_every_level_ = false;
  std::atomic<int64_t> comm_bytes_{0};
  CudaGang* gang_ = nullptr;
};

}  // namespace attnaudit

#endif  // ATTNAUDIT_KERNELS_CUDA_BACKEND_H_
