#include "server/device_pool/device_pool.h"

#include <algorithm>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/cpu_device/cpu_device.h"

#ifdef ATTNAUDIT_HAVE_CUDA
#include "kernels/cuda_backend.h"
#include "server/cuda_device/cuda_device.h"
#endif

namespace attnaudit::server {
namespace {

void AddCpuWorkers(const DevicePoolOptions& o, DevicePool* pool) {
  pool->devices = MakeCpuDevices(o.cpu_workers, o.cpu_threads);
  for (const auto& d : pool->devices)
    pool->descriptions.push_back(d->Describe());
}

std::string Workers(int n) {
  return absl::StrCat(n, n == 1 ? " CPU worker" : " CPU workers");
}

#ifdef ATTNAUDIT_HAVE_CUDA
absl::Status AddGpuWorkers(const DevicePoolOptions& o,
                           const std::vector<int>& ordinals, DevicePool* pool) {
  const int hw = std::max(1u, std::thread::hardware_concurrency());
  const int host_threads =
      o.gpu_host_threads > 0
          ? o.gpu_host_threads
          : std::max(1,
                     hw / std::max<int>(1, static_cast<int>(ordinals.size())));
  for (int ordinal : ordinals) {
    absl::StatusOr<std::unique_ptr<CudaDevice>> gpu =
        CudaDevice::Create(ordinal, o.gpu_memory_pool_bytes, host_threads);
    if (!gpu.ok()) {
      return absl::Status(gpu.status().code(),
                          absl::StrCat("--devices: cuda:", ordinal, ": ",
                                       gpu.status().message()));
    }
    pool->descriptions.push_back((*gpu)->Describe());
    pool->devices.push_back(*std::move(gpu));
  }
  pool->on_gpus = true;
  pool->note = absl::StrCat(
      "--devices ", DeviceSelectionText(o.selection), ": ", ordinals.size(),
      ordinals.size() == 1 ? " GPU worker" : " GPU workers");
  return absl::OkStatus();
}
#endif

}  // namespace

absl::StatusOr<DevicePool> MakeDevicePool(const DevicePoolOptions& o) {
  DevicePool pool;
#ifdef ATTNAUDIT_HAVE_CUDA
  pool.cuda_built = true;
#endif
  const DeviceSelection& sel = o.selection;
  if (sel.mode == DeviceSelection::Mode::kCpu) {
    AddCpuWorkers(o, &pool);
    return pool;
  }
#ifdef ATTNAUDIT_HAVE_CUDA
  absl::StatusOr<std::vector<CudaDeviceInfo>> gpus = ListCudaDevices();
  if (sel.mode == DeviceSelection::Mode::kList) {
    const int visible = gpus.ok() ? static_cast<int>(gpus->size()) : 0;
    for (int ordinal : sel.gpus) {
      if (ordinal >= visible) {
        return absl::FailedPreconditionError(
            absl::StrCat("--devices: cuda:", ordinal, " is not visible (",
                         gpus.ok() ? absl::StrCat(visible, " GPUs")
                                   : std::string(gpus.status().message()),
                         ")"));
      }
    }
    if (absl::Status s = AddGpuWorkers(o, sel.gpus, &pool); !s.ok()) return s;
    return pool;
  }
  if (gpus.ok()) {
    std::vector<int> all;
    for (const CudaDeviceInfo& g : *gpus) all.push_back(g.ordinal);
    if (absl::Status s = AddGpuWorkers(o, all, &pool); !s.ok()) return s;
    return pool;
  }
  AddCpuWorkers(o, &pool);
  pool.note = absl::StrCat("--devices all: ", gpus.status().message(),
                           "; running on ", Workers(o.cpu_workers));
  return pool;
#else
  if (sel.mode == DeviceSelection::Mode::kList) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--devices ", DeviceSelectionText(sel),
        ": this build has no CUDA backend (ATTNAUDIT_ENABLE_CUDA)"));
  }
  AddCpuWorkers(o, &pool);
  pool.note =
      absl::StrCat("--devices all: this build has no CUDA backend; running on ",
                   Workers(o.cpu_workers));
  return pool;
#endif
}

}  // namespace attnaudit::server
