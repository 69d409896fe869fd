#include "kernels/cuda_gang.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "kernels/cuda_check.h"
#include "kernels/device_memory.h"

#ifdef ATTNAUDIT_HAVE_NCCL
#include "kernels/nccl_check.h"
#endif

namespace attnaudit {
#ifdef ATTNAUDIT_HAVE_NCCL
namespace {

// Each member's free device memory (cudaMemGetInfo), in member order.
absl::StatusOr<std::vector<int64_t>> FreeBytes(
    const std::vector<CudaBackend*>& members) {
  std::vector<int64_t> out;
  for (CudaBackend* m : members) {
    size_t free_bytes = 0;
    size_t total_bytes = 0;
    ATTNAUDIT_CUDA_RETURN_IF_ERROR(cudaSetDevice(m->device()));
    ATTNAUDIT_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
    out.push_back(static_cast<int64_t>(free_bytes));
  }
  return out;
}

// "cuda:0 812 MiB, cuda:1 790 MiB".
std::string DescribeFree(const std::vector<CudaBackend*>& members,
                         const std::vector<int64_t>& free_bytes) {
  std::string out;
  for (size_t i = 0; i < members.size(); ++i) {
    absl::StrAppend(&out, i == 0 ? "" : ", ", members[i]->name(), " ",
                    free_bytes[i] >> 20, " MiB");
  }
  return out;
}

}  // namespace
#endif

absl::StatusOr<std::unique_ptr<CudaGang>> CudaGang::Create(
    std::vector<CudaBackend*> members) {
  if (members.empty()) return absl::InvalidArgumentError("gang: no GPU");
  std::unique_ptr<CudaGang> gang(new CudaGang());
  gang->members_ = std::move(members);
  for (CudaBackend* m : gang->members_) {
    if (m == nullptr) return absl::InvalidArgumentError("gang: a null GPU");
    cudaStream_t s = nullptr;
    ATTNAUDIT_CUDA_RETURN_IF_ERROR(cudaSetDevice(m->device()));
    ATTNAUDIT_CUDA_RETURN_IF_ERROR(
        cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    gang->comm_streams_.push_back(s);
  }
  gang->comm_bytes_.assign(gang->members_.size(), 0);
  if (gang->size() == 1) return gang;
#ifdef ATTNAUDIT_HAVE_NCCL
  std::vector<int> devices;
  for (CudaBackend* m : gang->members_) devices.push_back(m->device());
  ATTNAUDIT_ASSIGN_OR_RETURN(std::vector<int64_t> free_before,
                             FreeBytes(gang->members_));
  gang->comms_.resize(devices.size(), nullptr);
  if (absl::Status s = cuda_internal::NcclStatus(
          ncclCommInitAll(gang->comms_.data(), static_cast<int>(devices.size()),
                          devices.data()),
          "ncclCommInitAll");
      !s.ok()) {
    return absl::Status(
        s.code(),
        absl::StrCat("gang ", gang->Names(), ": ", s.message(),
                     " (device memory free outside the pools: ",
                     DescribeFree(gang->members_, free_before),
                     "; a smaller --gpu-memory-pool-bytes leaves NCCL more)"));
  }
  if (absl::Status s = gang->WarmUp(); !s.ok()) return s;
  ATTNAUDIT_ASSIGN_OR_RETURN(std::vector<int64_t> free_after,
                             FreeBytes(gang->members_));
  for (size_t i = 0; i < devices.size(); ++i) {
    gang->comm_bytes_[i] = std::max<int64_t>(0, free_before[i] - free_after[i]);
    gang->members_[i]->AddCommMemory(gang->comm_bytes_[i]);
  }
  return gang;
#else
  return absl::FailedPreconditionError(
      absl::StrCat("gang of ", gang->size(),
                   " GPUs: this build has no NCCL (the ring across GPUs needs "
                   "it)"));
#endif
}

CudaGang::~CudaGang() {
#ifdef ATTNAUDIT_HAVE_NCCL
  for (ncclComm_t c : comms_) {
    if (c != nullptr) ncclCommDestroy(c);
  }
#endif
  for (size_t i = 0; i < comm_bytes_.size(); ++i) {
    members_[i]->AddCommMemory(-comm_bytes_[i]);
  }
  for (size_t i = 0; i < comm_streams_.size(); ++i) {
    cudaSetDevice(members_[i]->device());
    cudaStreamSynchronize(comm_streams_[i]);
    cudaStreamDestroy(comm_streams_[i]);
  }
}

std::string CudaGang::Names() const {
  std::string out;
  for (const CudaBackend* m : members_) {
    absl::StrAppend(&out, out.empty() ? "" : ",", m->name());
  }
  return out;
}

absl::Status CudaGang::AsyncError() const {
#ifdef ATTNAUDIT_HAVE_NCCL
  for (size_t i = 0; i < comms_.size(); ++i) {
    if (comms_[i] == nullptr) continue;
    ncclResult_t result = ncclSuccess;
    ATTNAUDIT_NCCL_RETURN_IF_ERROR(ncclCommGetAsyncError(comms_[i], &result));
    if (result != ncclSuccess && result != ncclInProgress) {
      return absl::UnavailableError(
          absl::StrCat("nccl: the communicator of ", members_[i]->name(),
                       " failed: ", ncclGetErrorString(result)));
    }
  }
#endif
  return absl::OkStatus();
}

void CudaGang::Abort() {
  broken_ = true;
#ifdef ATTNAUDIT_HAVE_NCCL
  for (ncclComm_t& c : comms_) {
    if (c != nullptr) ncclCommAbort(c);
    c = nullptr;  // aborted communicators are freed; never destroy them
  }
#endif
}

int CudaGang::IndexOfDevice(int device) const {
  for (int i = 0; i < size(); ++i) {
    if (members_[i]->device() == device) return i;
  }
  return -1;
}

// One 8-byte exchange from every GPU to the next, so the ring's connections
// exist before the first timed round.
absl::Status CudaGang::WarmUp() {
#ifdef ATTNAUDIT_HAVE_NCCL
  const int g = size();
  std::vector<char*> buffers(static_cast<size_t>(g), nullptr);
  for (int i = 0; i < g; ++i) {
    ATTNAUDIT_CUDA_RETURN_IF_ERROR(cudaSetDevice(members_[i]->device()));
    ATTNAUDIT_ASSIGN_OR_RETURN(buffers[i],
                               members_[i]->arena().Allocate(16, "warm-up"));
  }
  ATTNAUDIT_NCCL_RETURN_IF_ERROR(ncclGroupStart());
  for (int i = 0; i < g; ++i) {
    ATTNAUDIT_NCCL_RETURN_IF_ERROR(ncclSend(
        buffers[i], 8, ncclUint8, (i + 1) % g, comms_[i], comm_streams_[i]));
    ATTNAUDIT_NCCL_RETURN_IF_ERROR(ncclRecv(buffers[i] + 8, 8, ncclUint8,
                                            (i + g - 1) % g, comms_[i],
                                            comm_streams_[i]));
  }
  ATTNAUDIT_NCCL_RETURN_IF_ERROR(ncclGroupEnd());
  for (int i = 0; i < g; ++i) {
    ATTNAUDIT_CUDA_RETURN_IF_ERROR(cudaSetDevice(members_[i]->device()));
    ATTNAUDIT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(comm_streams_[i]));
    members_[i]->arena().Reset();
  }
#endif
  return absl::OkStatus();
}

}  // namespace attnaudit
