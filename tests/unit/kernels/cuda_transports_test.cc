// The CUDA-local ring transport (kernels/cuda_transports.h) on a GPU: W
// ranks as streams of one GPU run the real ring schedule step by step from
// the host, as the GPU replay does (all ranks' receives and sends, then
// all ranks' grants), the chunks moving by device copies ordered only by
// the transport's events. Every rank's slot, copied back on its own stream
// after the receive, holds the chunk the schedule says (a tag: source
// rank, fill step); the run drains; and a misuse is the ring protocol's
// Internal error (core/cp/transport/ring_protocol.h). Without a visible
// GPU the tests skip with the driver's one-line reason.
#include "kernels/cuda_transports.h"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/attention/units.h"
#include "core/cp/schedule/schedule.h"
#include "gtest/gtest.h"
#include "kernels/cuda_backend.h"

namespace attnaudit {
namespace testing {
namespace {

using cuda_internal::CudaLocalTransport;
using cuda_internal::RankPlacement;

#define REQUIRE_GPU()                                                     \
  do {                                                                    \
    absl::StatusOr<std::vector<CudaDeviceInfo>> gpus = ListCudaDevices(); \
    if (!gpus.ok()) GTEST_SKIP() << gpus.status().message();              \
  } while (0)

constexpr int64_t kSlotBytes = 64;

struct Tag {
  int64_t source = -1;
  int64_t fill_step = -1;
};

// W ranks on cuda:0: a stream and two device slots each, released at the
// end of the test (after the transport, which must not outlive them).
class Ring {
 public:
  explicit Ring(int64_t world) : world_(world) {}
  ~Ring() {
    transport_.reset();
    cudaDeviceSynchronize();
    for (cudaStream_t s : streams_) cudaStreamDestroy(s);
    if (memory_ != nullptr) cudaFree(memory_);
  }

  absl::Status Create() {
    if (cudaSetDevice(0) != cudaSuccess ||
        cudaMalloc(reinterpret_cast<void**>(&memory_),
                   static_cast<size_t>(2 * world_ * kSlotBytes)) !=
            cudaSuccess) {
      return absl::InternalError("cuda:0: no slots");
    }
    std::vector<RankPlacement> places;
    for (int64_t k = 0; k < world_; ++k) {
      cudaStream_t s = nullptr;
      if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) {
        return absl::InternalError("cuda:0: no stream");
      }
      streams_.push_back(s);
      RankPlacement p;
      p.device = 0;
      p.stream = s;
      p.slots[0] = memory_ + (2 * k) * kSlotBytes;
      p.slots[1] = memory_ + (2 * k + 1) * kSlotBytes;
      places.push_back(p);
    }
    absl::StatusOr<std::unique_ptr<CudaLocalTransport>> t =
        CudaLocalTransport::Create(std::move(places), kSlotBytes);
    if (!t.ok()) return t.status();
    transport_ = *std::move(t);
    return absl::OkStatus();
  }

  CudaLocalTransport& transport() { return *transport_; }
  cudaStream_t stream(int64_t k) const { return streams_[k]; }

 private:
  int64_t world_;
  char* memory_ = nullptr;
  std::vector<cudaStream_t> streams_;
  std::unique_ptr<CudaLocalTransport> transport_;
};

TEST(CudaLocalTransportTest, TheRingMovesTheScheduledChunksForEveryW) {
  REQUIRE_GPU();
  for (int64_t world = 1; world <= 8; ++world) {
    // One row, two one-token chunks per rank (page size 1): 2W steps.
    std::vector<std::vector<KvUnit>> units(1);
    for (int32_t b = 0; b < 2 * world; ++b) {
      units[0].push_back({b, 0, 1, static_cast<int32_t>(b % world)});
    }
    const CpShards shards = PlanShards(units, world, 1);
    const CpSchedule s(shards, CpReplayStrategy::kRing, 1, 1, 1);
    Ring ring(world);
    ASSERT_TRUE(ring.Create().ok());
    CudaLocalTransport& t = ring.transport();
    std::vector<Tag> held(static_cast<size_t>(world * s.steps()));
    for (int64_t k = 0; k < world; ++k) {
      for (int64_t u = 0; u < 2 && u < s.steps(); ++u) {
        if (s.Receives(u)) {
          ASSERT_TRUE(t.Release(k, u).ok());
        }
      }
    }
    for (int64_t step = 0; step < s.steps(); ++step) {
      for (int64_t k = 0; k < world; ++k) {
        char* slot = t.Slot(k, step % 2);
        if (s.Receives(step)) {
          absl::StatusOr<int64_t> bytes = t.Receive(k, step);
          ASSERT_TRUE(bytes.ok()) << bytes.status();
          ASSERT_EQ(*bytes, static_cast<int64_t>(sizeof(Tag)));
        } else {
          const Tag tag{k, step};
          ASSERT_EQ(cudaMemcpyAsync(slot, &tag, sizeof(tag),
                                    cudaMemcpyHostToDevice, ring.stream(k)),
                    cudaSuccess);
          ASSERT_EQ(cudaStreamSynchronize(ring.stream(k)), cudaSuccess);
        }
        // Stream-ordered after the receive: the slot must hold the chunk.
        ASSERT_EQ(
            cudaMemcpyAsync(&held[k * s.steps() + step], slot, sizeof(Tag),
                            cudaMemcpyDeviceToHost, ring.stream(k)),
            cudaSuccess);
        ASSERT_EQ(cudaStreamSynchronize(ring.stream(k)), cudaSuccess);
        if (s.Sends(step)) {
          ASSERT_TRUE(t.Send(k, step, sizeof(Tag)).ok());
        }
      }
      for (int64_t k = 0; k < world; ++k) {
        if (s.Sends(step)) {
          ASSERT_TRUE(t.WaitSent(k, step).ok());
        }
        if (s.GrantsAfter(step)) {
          ASSERT_TRUE(t.Release(k, step + 2).ok());
        }
      }
    }
    EXPECT_TRUE(t.Drained().ok()) << "W " << world;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    for (int64_t k = 0; k < world; ++k) {
      for (int64_t step = 0; step < s.steps(); ++step) {
        const int64_t round = s.StepAt(step).round;
        const Tag& got = held[k * s.steps() + step];
        EXPECT_EQ(got.source, s.SourceRank(k, round))
            << "W " << world << " rank " << k << " step " << step;
        EXPECT_EQ(got.fill_step, step - round)
            << "W " << world << " rank " << k << " step " << step;
      }
    }
  }
}

TEST(CudaLocalTransportTest, AMisuseIsTheProtocolsError) {
  REQUIRE_GPU();
  Ring ring(2);
  ASSERT_TRUE(ring.Create().ok());
  CudaLocalTransport& t = ring.transport();
  // A receive never granted would wait forever: Internal at once.
  EXPECT_EQ(t.Receive(1, 1).status().code(), absl::StatusCode::kInternal);
  EXPECT_EQ(t.Send(0, 0, kSlotBytes + 1).code(), absl::StatusCode::kInternal);
  EXPECT_EQ(t.WaitSent(0, 0).code(), absl::StatusCode::kInternal);
  ASSERT_TRUE(t.Release(1, 1).ok());
  EXPECT_EQ(t.Release(1, 3).code(), absl::StatusCode::kInternal);
  EXPECT_EQ(t.Drained().code(), absl::StatusCode::kInternal);
  t.Abort(absl::CancelledError("stop"));
  EXPECT_EQ(t.Receive(1, 1).status().code(), absl::StatusCode::kCancelled);
}

}  // namespace
}  // namespace testing
}  // namespace attnaudit
