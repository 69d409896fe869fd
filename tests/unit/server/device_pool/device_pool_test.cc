// --devices and the pool it selects (server/device_pool). The checks that
// depend on the machine ask it first: with a visible GPU (a CUDA build on
// a GPU machine) "all" must give GPU workers, without one the CPU workers
// and a note saying why.
#include "server/device_pool/device_pool.h"

#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "server/device_pool/device_selection.h"

namespace attnaudit::server {
namespace {

TEST(DeviceSelectionTest, ParsesAndSpellsBack) {
  for (const auto& [in, out] :
       {std::pair<const char*, const char*>{"cpu", "cpu"},
        {" ALL ", "all"},
        {"cuda:2,cuda:0", "cuda:0,cuda:2"},
        {"cuda:0, cuda:1", "cuda:0,cuda:1"}}) {
    absl::StatusOr<DeviceSelection> s = ParseDeviceSelection(in);
    ASSERT_TRUE(s.ok()) << in << ": " << s.status();
    EXPECT_EQ(DeviceSelectionText(*s), out);
  }
  for (const char* bad : {"", "gpu", "cuda", "cuda:1x", "cuda:0,,cuda:1",
                          "cuda:5,cuda:5", "cuda:99999"}) {
    absl::StatusOr<DeviceSelection> s = ParseDeviceSelection(bad);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

DevicePoolOptions Options(absl::string_view spec) {
  DevicePoolOptions o;
  o.selection = *ParseDeviceSelection(spec);
  o.cpu_workers = 2;
  o.cpu_threads = 1;
  o.gpu_memory_pool_bytes = int64_t{64} << 20;
  return o;
}

TEST(DevicePoolTest, CpuIsTheCpuWorkers) {
  absl::StatusOr<DevicePool> pool = MakeDevicePool(Options("cpu"));
  ASSERT_TRUE(pool.ok()) << pool.status();
  ASSERT_EQ(pool->devices.size(), 2u);
  ASSERT_EQ(pool->descriptions.size(), 2u);
  EXPECT_EQ(pool->devices[0]->name(), "cpu:0");
  EXPECT_EQ(pool->descriptions[1].name, "cpu:1");
  EXPECT_EQ(pool->descriptions[1].model, "CPU worker");
  EXPECT_FALSE(pool->on_gpus);
  EXPECT_TRUE(pool->note.empty());
}

TEST(DevicePoolTest, AllRunsOnGpusOrSaysWhyItRunsOnTheCpuWorkers) {
  absl::StatusOr<DevicePool> pool = MakeDevicePool(Options("all"));
  ASSERT_TRUE(pool.ok()) << pool.status();
  ASSERT_FALSE(pool->devices.empty());
  if (pool->on_gpus) {
    // A GPU machine: one worker per GPU, described by the driver.
    for (size_t i = 0; i < pool->devices.size(); ++i) {
      EXPECT_EQ(pool->devices[i]->kind(), "cuda");
      EXPECT_FALSE(pool->descriptions[i].model.empty());
      EXPECT_GT(pool->descriptions[i].memory_bytes, 0);
      EXPECT_FALSE(pool->descriptions[i].compute_capability.empty());
    }
    return;
  }
  ASSERT_EQ(pool->devices.size(), 2u);
  EXPECT_EQ(pool->devices[0]->kind(), "cpu");
  EXPECT_TRUE(absl::StartsWith(pool->note, "--devices all: ")) << pool->note;
  EXPECT_TRUE(absl::EndsWith(pool->note, "running on 2 CPU workers"))
      << pool->note;
  if (pool->cuda_built) {
    // The driver's reason, e.g. cudaGetDeviceCount's error.
    EXPECT_TRUE(absl::StrContains(pool->note, "no usable GPU")) << pool->note;
  } else {
    EXPECT_TRUE(absl::StrContains(pool->note, "no CUDA backend")) << pool->note;
  }
}

TEST(DevicePoolTest, AMissingGpuFailsNamingTheFlag) {
  absl::StatusOr<DevicePool> pool = MakeDevicePool(Options("cuda:1023"));
  EXPECT_EQ(pool.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StartsWith(pool.status().message(), "--devices"))
      << pool.status();
}

}  // namespace
}  // namespace attnaudit::server
