#include "kernels/cuda_transports.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "kernels/cuda_check.h"
#include "kernels/cuda_gang.h"

#ifdef ATTNAUDIT_HAVE_NCCL
#include "kernels/nccl_check.h"
#endif

namespace attnaudit {
namespace cuda_internal {

DeviceRingTransport::DeviceRingTransport(std::vector<RankPlacement> ranks,
                                         int64_t slot_bytes)
    : slot_bytes_(slot_bytes),
      protocol_(static_cast<int64_t>(ranks.size()), slot_bytes) {
  for (RankPlacement& p : ranks) {
    RankIo io;
    io.place = p;
    ranks_.push_back(io);
  }
}

DeviceRingTransport::~DeviceRingTransport() {
  for (RankIo& r : ranks_) {
    cudaSetDevice(r.place.device);
    for (cudaEvent_t e : {r.ready, r.sent[0], r.sent[1], r.arrived[0],
                          r.arrived[1], r.granted[0], r.granted[1]}) {
      if (e != nullptr) cudaEventDestroy(e);
    }
  }
}

absl::Status DeviceRingTransport::CreateEvents() {
  for (RankIo& r : ranks_) {
    ATTNAUDIT_CUDA_RETURN_IF_ERROR(cudaSetDevice(r.place.device));
    for (cudaEvent_t* e : {&r.ready, &r.sent[0], &r.sent[1], &r.arrived[0],
                           &r.arrived[1], &r.granted[0], &r.granted[1]}) {
      ATTNAUDIT_CUDA_RETURN_IF_ERROR(
          cudaEventCreateWithFlags(e, cudaEventDisableTiming));
    }
  }
  return absl::OkStatus();
}

absl::Status DeviceRingTransport::BeginSend(int64_t rank, int64_t step,
                                            int64_t bytes) {
  ATTNAUDIT_RETURN_IF_ERROR(protocol_.Post(rank, step, bytes));
  ATTNAUDIT_RETURN_IF_ERROR(protocol_.AwaitCredit(rank, step));
  const RankIo& r = ranks_[rank];
  ATTNAUDIT_CUDA_RETURN_IF_ERROR(cudaSetDevice(r.place.device));
  ATTNAUDIT_CUDA_RETURN_IF_ERROR(cudaEventRecord(r.ready, r.place.stream));
  return absl::OkStatus();
}

absl::Status DeviceRingTransport::OrderCopy(int64_t rank, int64_t step,
                                            cudaStream_t stream) {
  const RankIo& next = ranks_[protocol_.Next(rank)];
  ATTNAUDIT_CUDA_RETURN_IF_ERROR(
      cudaStreamWaitEvent(stream, ranks_[rank].ready, 0));
  ATTNAUDIT_CUDA_RETURN_IF_ERROR(
      cudaStreamWaitEvent(stream, next.granted[(step + 1) % 2], 0));
  return absl::OkStatus();
}

absl::Status DeviceRingTransport::EndSend(int64_t rank, int64_t step,
                                          cudaStream_t stream) {
  const int64_t next = protocol_.Next(rank);
  ATTNAUDIT_CUDA_RETURN_IF_ERROR(
      cudaEventRecord(ranks_[rank].sent[step % 2], stream));
  ATTNAUDIT_CUDA_RETURN_IF_ERROR(
      cudaEventRecord(ranks_[next].arrived[(step + 1) % 2], stream));
  return protocol_.Delivered(rank, step);
}

absl::Status DeviceRingTransport::WaitSent(int64_t rank, int64_t step) {
  ATTNAUDIT_RETURN_IF_ERROR(protocol_.AwaitSent(rank, step));
  const RankIo& r = ranks_[rank];
  ATTNAUDIT_CUDA_RETURN_IF_ERROR(cudaSetDevice(r.place.device));
  ATTNAUDIT_CUDA_RETURN_IF_ERROR(
      cudaStreamWaitEvent(r.place.stream, r.sent[step % 2], 0));
  return absl::OkStatus();
}

absl::StatusOr<int64_t> DeviceRingTransport::Receive(int64_t rank,
                                                     int64_t step) {
  absl::StatusOr<int64_t> bytes = protocol_.Receive(rank, step);
  if (!bytes.ok()) return bytes;
  const RankIo& r = ranks_[rank];
  ATTNAUDIT_CUDA_RETURN_IF_ERROR(cudaSetDevice(r.place.device));
  ATTNAUDIT_CUDA_RETURN_IF_ERROR(
      cudaStreamWaitEvent(r.place.stream, r.arrived[step % 2], 0));
  return bytes;
}

absl::Status DeviceRingTransport::Release(int64_t rank, int64_t step) {
  ATTNAUDIT_RETURN_IF_ERROR(protocol_.CheckGrant(rank, step));
  const RankIo& r = ranks_[rank];
  ATTNAUDIT_CUDA_RETURN_IF_ERROR(cudaSetDevice(r.place.device));
  ATTNAUDIT_CUDA_RETURN_IF_ERROR(
      cudaEventRecord(r.granted[step % 2], r.place.stream));
  return protocol_.Grant(rank, step);
}

// ---------------------------------------------------------------- local

absl::StatusOr<std::unique_ptr<CudaLocalTransport>> CudaLocalTransport::Create(
    std::vector<RankPlacement> ranks, int64_t slot_bytes) {
  if (ranks.empty()) {
    return absl::InvalidArgumentError("cp transport: no ranks");
  }
  std::unique_ptr<CudaLocalTransport> t(
      new CudaLocalTransport(std::move(ranks), slot_bytes));
  if (absl::Status s = t->CreateEvents(); !s.ok()) return s;
  for (const RankIo& r : t->ranks_) {
    if (r.place.device != t->ranks_[0].place.device) {
      return absl::InvalidArgumentError(
          "cp transport: a CUDA-local ring needs every rank on one GPU");
    }
    cudaStream_t s = nullptr;
    ATTNAUDIT_CUDA_RETURN_IF_ERROR(cudaSetDevice(r.place.device));
    ATTNAUDIT_CUDA_RETURN_IF_ERROR(
        cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    t->copy_streams_.push_back(s);
  }
  return t;
}

CudaLocalTransport::~CudaLocalTransport() {
  for (cudaStream_t s : copy_streams_) {
    cudaStreamSynchronize(s);
    cudaStreamDestroy(s);
  }
}

absl::Status CudaLocalTransport::Send(int64_t rank, int64_t step,
                                      int64_t bytes) {
  if (absl::Status s = BeginSend(rank, step, bytes); !s.ok()) return s;
  cudaStream_t copy = copy_streams_[rank];
  if (absl::Status s = OrderCopy(rank, step, copy); !s.ok()) return s;
  const int64_t next = protocol_.Next(rank);
  ATTNAUDIT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
      Slot(next, (step + 1) % 2), Slot(rank, step % 2),
      static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice, copy));
  return EndSend(rank, step, copy);
}

// ---------------------------------------------------------------- NCCL

#ifdef ATTNAUDIT_HAVE_NCCL
absl::StatusOr<std::unique_ptr<NcclTransport>> NcclTransport::Create(
    std::vector<RankPlacement> ranks, int64_t slot_bytes, CudaGang* gang) {
  if (ranks.empty() || gang == nullptr) {
    return absl::InvalidArgumentError("cp transport: no ranks or no gang");
  }
  for (const RankPlacement& r : ranks) {
    if (gang->IndexOfDevice(r.device) < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("cp transport: cuda:", r.device, " is not in the gang"));
    }
  }
  std::unique_ptr<NcclTransport> t(
      new NcclTransport(std::move(ranks), slot_bytes, gang));
  if (absl::Status s = t->CreateEvents(); !s.ok()) return s;
  return t;
}

absl::Status NcclTransport::Send(int64_t rank, int64_t step, int64_t bytes) {
  if (absl::Status s = BeginSend(rank, step, bytes); !s.ok()) return s;
  std::lock_guard<std::mutex> lock(mu_);
  if (pending_step_ != step) {
    if (!pending_.empty()) {
      return absl::InternalError(absl::StrCat("cp transport: step ", step,
                                              " sends before step ",
                                              pending_step_, " was issued"));
    }
    pending_step_ = step;
  }
  pending_.push_back({rank, bytes});
  if (static_cast<int64_t>(pending_.size()) < world()) return absl::OkStatus();
  return IssueStep(step);
}

absl::Status NcclTransport::WaitSent(int64_t rank, int64_t step) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (pending_step_ == step && !pending_.empty()) {
      // The group is issued by the step's last Send; waiting for it first
      // would never end on a driver that issues one call at a time.
      return absl::InternalError(absl::StrCat(
          "cp transport: rank ", rank, " waits for its send of step ", step,
          " before every rank's send of that step was issued"));
    }
  }
  return DeviceRingTransport::WaitSent(rank, step);
}

// One group for the step: every cross-GPU hop as an ncclSend/ncclRecv pair
// on the two GPUs' communication streams, every same-GPU hop as a device
// copy, each ordered after the sender's data and the receiver's grant.
absl::Status NcclTransport::IssueStep(int64_t step) {
  std::vector<Pending> sends = std::move(pending_);
  pending_.clear();
  for (const Pending& p : sends) {
    const int64_t next = protocol_.Next(p.rank);
    const int src = gang_->IndexOfDevice(ranks_[p.rank].place.device);
    const int dst = gang_->IndexOfDevice(ranks_[next].place.device);
    ATTNAUDIT_CUDA_RETURN_IF_ERROR(cudaSetDevice(ranks_[p.rank].place.device));
    if (absl::Status s = OrderCopy(p.rank, step, gang_->comm_stream(src));
        !s.ok()) {
      return s;
    }
    if (dst != src) {
      ATTNAUDIT_CUDA_RETURN_IF_ERROR(cudaSetDevice(ranks_[next].place.device));
      ATTNAUDIT_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(
          gang_->comm_stream(dst), ranks_[next].granted[(step + 1) % 2], 0));
    }
  }
  ATTNAUDIT_NCCL_RETURN_IF_ERROR(ncclGroupStart());
  for (const Pending& p : sends) {
    const int64_t next = protocol_.Next(p.rank);
    const int src = gang_->IndexOfDevice(ranks_[p.rank].place.device);
    const int dst = gang_->IndexOfDevice(ranks_[next].place.device);
    char* from = Slot(p.rank, step % 2);
    char* to = Slot(next, (step + 1) % 2);
    const size_t n = static_cast<size_t>(p.bytes);
    if (n == 0) continue;
    if (src == dst) {
      ATTNAUDIT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
          to, from, n, cudaMemcpyDeviceToDevice, gang_->comm_stream(src)));
      continue;
    }
    ATTNAUDIT_NCCL_RETURN_IF_ERROR(ncclSend(
        from, n, ncclUint8, dst, gang_->comm(src), gang_->comm_stream(src)));
    ATTNAUDIT_NCCL_RETURN_IF_ERROR(ncclRecv(
        to, n, ncclUint8, src, gang_->comm(dst), gang_->comm_stream(dst)));
  }
  ATTNAUDIT_NCCL_RETURN_IF_ERROR(ncclGroupEnd());
  for (const Pending& p : sends) {
    const int64_t next = protocol_.Next(p.rank);
    const int src = gang_->IndexOfDevice(ranks_[p.rank].place.device);
    const int dst = gang_->IndexOfDevice(ranks_[next].place.device);
    ATTNAUDIT_CUDA_RETURN_IF_ERROR(cudaSetDevice(ranks_[p.rank].place.device));
    ATTNAUDIT_CUDA_RETURN_IF_ERROR(cudaEventRecord(
        ranks_[p.rank].sent[step % 2], gang_->comm_stream(src)));
    ATTNAUDIT_CUDA_RETURN_IF_ERROR(cudaSetDevice(ranks_[next].place.device));
    ATTNAUDIT_CUDA_RETURN_IF_ERROR(cudaEventRecord(
        ranks_[next].arrived[(step + 1) % 2], gang_->comm_stream(dst)));
    ATTNAUDIT_RETURN_IF_ERROR(protocol_.Delivered(p.rank, step));
  }
  return absl::OkStatus();
}
#endif  // ATTNAUDIT_HAVE_NCCL

}  // namespace cuda_internal
}  // namespace attnaudit
