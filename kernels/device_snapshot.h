// A prepared snapshot (core/attention/attention.h PreparedAttention) on one
// GPU: the pieces the fused pass and the CP replay read, uploaded once per
// job into the backend's pool through its staging buffers, and the launch
// parameters they share. Internal to kernels/.
#ifndef ATTNAUDIT_KERNELS_DEVICE_SNAPSHOT_H_
#define ATTNAUDIT_KERNELS_DEVICE_SNAPSHOT_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "core/attention/attention.h"
#include "kernels/attention_kernels.h"
#include "kernels/device_memory.h"
#include "kernels/shard_pages.h"

namespace attnaudit {
namespace cuda_internal {

struct DeviceSnapshot {
  const char* k = nullptr;  // the K pool as prepared (pre-RoPE: rotated f32)
  const char* v = nullptr;
  const int64_t* positions = nullptr;        // [N * P] slot positions
  const double* q = nullptr;                 // [B,Sq,Hq,D]
  const int64_t* query_positions = nullptr;  // [B,Sq]
  const double* k_scale = nullptr;           // [Hkv]
  const int64_t* unit_base = nullptr;        // [B + 1] units before row b
  int64_t bytes = 0;                         // uploaded in all
};

// Element strides (row, head) of a pool of `layout`.
void PoolStrides(KvLayout layout, const SnapshotDims& d, int64_t* row,
                 int64_t* head);

// The widest asynchronous copy (16, 8, 4; else 1) that every row start of
// K and V allows: rows of D elements at multiples of their size from a
// 256-byte aligned base.
int CopyWidth(int64_t k_row_bytes, int64_t v_row_bytes);

// Uploads the snapshot's inputs on `stream`. With a `shard` that is not
// the whole pool, k, v and positions hold only the shard's pages, compact
// (kernels/shard_pages.h: page i of the copy is shard->pages()[i]): the CP
// replay's fills read them at ShardPages::Compact offsets; the fused pass,
// which reads pages through the block table, needs the whole pool.
absl::StatusOr<DeviceSnapshot> UploadSnapshot(
    const PreparedAttention& p, DeviceArena& arena, PinnedStaging& staging,
    cudaStream_t stream, const ShardPages* shard = nullptr);

// The launch parameters every pass over this snapshot shares (inputs,
// dims, the variant); the caller sets the work, runs and outputs.
PassParams BaseParams(const PreparedAttention& p, const DeviceSnapshot& s);

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
