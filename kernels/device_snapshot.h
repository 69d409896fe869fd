// A prepared snapshot (core/attention/attention.h PreparedAttention) on one
// GPU: the pieces the fused pass and the CP replay read, uploaded once per
// job into the backend's pool through its staging buffers (the launch
// parameters are kernels/pass_plan.h's BaseParams). Internal to kernels/.
#ifndef ATTNAUDIT_KERNELS_DEVICE_SNAPSHOT_H_
#define ATTNAUDIT_KERNELS_DEVICE_SNAPSHOT_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "core/attention/attention.h"
#include "kernels/device_memory.h"
#include "kernels/pass_plan.h"
#include "kernels/shard_pages.h"

namespace attnaudit {
namespace cuda_internal {

// The inputs in the pool (PassInputs) and the bytes uploaded.
struct DeviceSnapshot : PassInputs {
  int64_t bytes = 0;
};

// Uploads the snapshot's inputs on `stream`. With a `shard` that is not
// the whole pool, k, v and positions hold only the shard's pages, compact
// (kernels/shard_pages.h: page i of the copy is shard->pages()[i]): the CP
// replay's fills read them at ShardPages::Compact offsets; the fused pass,
// which reads pages through the block table, needs the whole pool.
absl::StatusOr<DeviceSnapshot> UploadSnapshot(
    const PreparedAttention& p, DeviceArena& arena, PinnedStaging& staging,
    cudaStream_t stream, const ShardPages* shard = nullptr);

// Uploads a host vector into the arena.
template <typename T, typename Alloc>
absl::StatusOr<T*> UploadVector(const std::vector<T, Alloc>& v,
                                const char* what, DeviceArena& arena,
                                PinnedStaging& staging, cudaStream_t stream) {
  absl::StatusOr<T*> d =
      arena.AllocateArray<T>(static_cast<int64_t>(v.size()), what);
  if (!d.ok() || v.empty()) return d;
  absl::Status s = staging.Upload(
      *d, v.data(), static_cast<int64_t>(v.size() * sizeof(T)), stream);
  if (!s.ok()) return s;
  return d;
}

}  // namespace cuda_internal
}  // namespace attnaudit

#endif  // ATTNAUDIT_KERNELS_DEVICE_SNAPSHOT_H_
