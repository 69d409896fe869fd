// The scheduler's device pool for a --devices selection
// (device_selection.h): CPU workers, or one worker per GPU (CudaDevice,
// in builds with the CUDA backend), with what GetCapabilities and the
// start-up log say about it.
//
//   --devices cpu      the CPU workers.
//   --devices all      every visible GPU; without one (no CUDA backend in
//                      the build, no device, no driver) the CPU workers, and
//                      `note` says why -- the server starts either way.
//   --devices cuda:N,… those GPUs; FailedPrecondition naming --devices when
//                      the build has no CUDA backend or one is missing.
// A GPU that exists but cannot be set up (its pool does not fit) fails the
// start with that GPU's error: an operator who asked for it must know.
//
// Thread safety: call once at start-up.
#ifndef ATTNAUDIT_SERVER_DEVICE_POOL_DEVICE_POOL_H_
#define ATTNAUDIT_SERVER_DEVICE_POOL_DEVICE_POOL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/device_pool/device_selection.h"
#include "server/scheduler/device.h"

namespace attnaudit::server {

struct DevicePoolOptions {
  DeviceSelection selection;
  // The CPU pool's shape (already resolved from the flags).
  int cpu_workers = 1;
  int cpu_threads = 1;
  // Device memory pool of each GPU worker; 0: 3/4 of its free memory.
  int64_t gpu_memory_pool_bytes = 0;
  // Host threads of each GPU worker (validation, log-probs, CP combines);
  // 0: the machine's threads shared among the GPU workers.
  int gpu_host_threads = 0;
};

struct DevicePool {
  std::vector<std::unique_ptr<Device>> devices;
  std::vector<DeviceDescription> descriptions;  // one per device, same order
  // What runs where, and why when it is not what was asked for, e.g.
  // "--devices all: no usable GPU (cudaGetDeviceCount: cudaErrorNoDevice
  // ...); running on 1 CPU worker". Empty for --devices cpu.
  std::string note;
  bool cuda_built = false;  // this build has the CUDA backend
  bool on_gpus = false;     // the pool is GPU workers
};

absl::StatusOr<DevicePool> MakeDevicePool(const DevicePoolOptions& options);

}  // namespace attnaudit::server

#endif  // ATTNAUDIT_SERVER_DEVICE_POOL_DEVICE_POOL_H_
