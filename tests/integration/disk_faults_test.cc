// Disk faults against an in-process server: a job whose result cannot be
// stored stays visible (RUNNING) and is stored, without a restart, once
// space returns; a Submit that cannot be spooled is RESOURCE_EXHAUSTED;
// a full or read-only data dir at start is one line naming --data-dir; no
// client-facing message names a server path.
//
// Two ways to get a small disk, the same scenarios on each:
//   Tmpfs  a real 16 MiB tmpfs mounted on the data dir and filled with a
//          filler file (needs CAP_SYS_ADMIN: root outside a container or
//          a privileged one; otherwise the test says so and skips);
//   Shim   LD_PRELOAD=libattnaudit_fault_fs.so (fault_fs/fault_fs.cc),
//          which makes writes under the data dir fail ENOSPC (or opens
//          fail EROFS) while a control file exists; works in any
//          container. ctest runs this binary once per variant.
#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/integration/test_server.h"

namespace attnaudit::testing {
namespace {

// A directory whose file system can be made full or read-only.
class SmallDisk {
 public:
  virtual ~SmallDisk() = default;
  virtual const std::string& dir() const = 0;
  virtual void Fill() = 0;
  virtual void MakeReadOnly() = 0;
  virtual void Heal() = 0;  // space back, writable again
};

class TmpfsDisk : public SmallDisk {
 public:
  // Null with *why set when no tmpfs can be mounted here.
  static std::unique_ptr<TmpfsDisk> Mount(std::string* why) {
    std::unique_ptr<TmpfsDisk> d(new TmpfsDisk(MakeTempDir("tmpfs")));
    if (::mount("tmpfs", d->dir_.c_str(), "tmpfs", 0, "size=16m") != 0) {
      *why = absl::StrCat("cannot mount a tmpfs (", std::strerror(errno),
                          "; needs CAP_SYS_ADMIN); the Shim variant covers "
                          "the same scenarios");
      return nullptr;
    }
    d->mounted_ = true;
    return d;
  }
  ~TmpfsDisk() override {
    if (mounted_) ::umount2(dir_.c_str(), MNT_DETACH);
  }
  const std::string& dir() const override { return dir_; }
  void Fill() override {
    std::ofstream filler(dir_ + "/filler", std::ios::binary);
    const std::string block(1 << 16, 'f');
    while (filler.write(block.data(), block.size())) {
    }
  }
  void MakeReadOnly() override {
    ASSERT_EQ(::mount("tmpfs", dir_.c_str(), "tmpfs", MS_REMOUNT | MS_RDONLY,
                      "size=16m"),
              0)
        << std::strerror(errno);
  }
  void Heal() override {
    ::mount("tmpfs", dir_.c_str(), "tmpfs", MS_REMOUNT, "size=16m");
    ::unlink((dir_ + "/filler").c_str());
  }

 private:
  explicit TmpfsDisk(std::string dir) : dir_(std::move(dir)) {}
  std::string dir_;
  bool mounted_ = false;
};

class ShimDisk : public SmallDisk {
 public:
  static std::unique_ptr<ShimDisk> Create(std::string* why) {
    const char* control = std::getenv("ATTNAUDIT_FAULT_FILE");
    const char* preload = std::getenv("LD_PRELOAD");
    if (control == nullptr || preload == nullptr ||
        !absl::StrContains(preload, "fault_fs")) {
      *why =
          "not running under the fault_fs shim (ctest sets LD_PRELOAD "
          "and ATTNAUDIT_FAULT_FILE for the Shim variant)";
      return nullptr;
    }
    return std::unique_ptr<ShimDisk>(
        new ShimDisk(MakeTempDir("shimdisk"), control));
  }
  ~ShimDisk() override { Heal(); }
  const std::string& dir() const override { return dir_; }
  void Fill() override { Write("ENOSPC"); }
  void MakeReadOnly() override { Write("EROFS"); }
  void Heal() override {
    ::unlink(control_.c_str());
    absl::SleepFor(absl::Milliseconds(5));  // the shim looks every 2 ms
  }

 private:
  ShimDisk(std::string dir, std::string control)
      : dir_(std::move(dir)), control_(std::move(control)) {}
  void Write(const char* what) {
    std::ofstream(control_) << what << "\n" << dir_ << "\n";
    absl::SleepFor(absl::Milliseconds(5));
  }
  std::string dir_;
  std::string control_;
};

std::unique_ptr<SmallDisk> MakeDisk(bool tmpfs, std::string* why) {
  if (tmpfs) return TmpfsDisk::Mount(why);
  return ShimDisk::Create(why);
}

class DiskFaultsTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    std::string why;
    disk_ = MakeDisk(GetParam(), &why);
    if (disk_ == nullptr) GTEST_SKIP() << why;
  }
  // No message a client sees may name the data dir.
  void ExpectNoPath(absl::string_view message) {
    EXPECT_FALSE(absl::StrContains(message, disk_->dir())) << message;
    EXPECT_FALSE(absl::StrContains(message, "/tmp")) << message;
  }
  std::unique_ptr<SmallDisk> disk_;
};

TEST_P(DiskFaultsTest, ResultsThatCannotBeStoredAreStoredWhenSpaceReturns) {
  auto gate = std::make_shared<GateState>();
  server::AuditServerOptions o = TestOptions(disk_->dir() + "/data");
  o.devices.push_back(std::make_unique<GateDevice>(gate, 0));
  o.sync_storage = true;
  auto t = StartServer(std::move(o));
  ASSERT_NE(t, nullptr);
  std::vector<std::string> ids;
  for (int tag = 1; tag <= 3; ++tag) {
    absl::StatusOr<v1::SubmitResponse> r =
        t->client->Submit(SmallSnapshot(tag));
    ASSERT_TRUE(r.ok()) << r.status();
    ids.push_back(r->job_id());
  }
  ASSERT_TRUE(gate->WaitStarted(1));  // job 1 runs, 2 and 3 wait

  disk_->Fill();
  // Nothing new can be spooled: refused, with a hint, without a path.
  absl::Status refused = t->client->Submit(SmallSnapshot(9)).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), "disk is full")) << refused;
  ExpectNoPath(refused.message());

  // The three acknowledged jobs finish, but their results cannot be stored.
  gate->Open();
  server::JobService* jobs = t->server->jobs();
  ASSERT_TRUE(WaitFor([&] { return jobs->results_pending() == 3; }));
  for (const std::string& id : ids) {
    absl::StatusOr<v1::JobResult> r = t->client->GetResult(id);
    ASSERT_TRUE(r.ok()) << id << ": " << r.status();  // visible, not NOT_FOUND
    EXPECT_EQ(r->state(), v1::JOB_STATE_RUNNING) << id;
  }
  EXPECT_EQ(CountFiles(t->data_dir + "/spool", ".job"), 3);

  // Space returns: the retries store every result, no restart needed.
  disk_->Heal();
  for (const std::string& id : ids) {
    const v1::JobResult r = WaitFinished(t->client.get(), id);
    EXPECT_EQ(r.state(), v1::JOB_STATE_DONE) << id;
    EXPECT_EQ(r.report().verdict(), v1::VERDICT_PASS) << id;
  }
  EXPECT_EQ(jobs->results_pending(), 0);
  EXPECT_EQ(CountFiles(t->data_dir + "/spool", ".job"), 0);
  // New work is accepted again.
  absl::StatusOr<v1::SubmitResponse> again =
      t->client->Submit(SmallSnapshot(10));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(WaitFinished(t->client.get(), again->job_id()).state(),
            v1::JOB_STATE_DONE);
}

TEST_P(DiskFaultsTest, AFullOrReadOnlyDataDirAtStartIsOneLineNamingTheFlag) {
  disk_->Fill();
  server::AuditServerOptions o = TestOptions(disk_->dir() + "/data");
  absl::StatusOr<std::unique_ptr<server::AuditServer>> s =
      server::AuditServer::Start(std::move(o));
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(absl::StartsWith(s.status().message(), "--data-dir "))
      << s.status();
  EXPECT_TRUE(absl::StrContains(s.status().message(), "no space left"))
      << s.status();
  EXPECT_FALSE(absl::StrContains(s.status().message(), "\n"));

  disk_->Heal();
  disk_->MakeReadOnly();
  s = server::AuditServer::Start(TestOptions(disk_->dir() + "/data"));
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(absl::StartsWith(s.status().message(), "--data-dir "))
      << s.status();
  EXPECT_TRUE(absl::StrContains(s.status().message(), "read-only"))
      << s.status();
  EXPECT_FALSE(absl::StrContains(s.status().message(), "\n"));
  disk_->Heal();
  EXPECT_TRUE(
      server::AuditServer::Start(TestOptions(disk_->dir() + "/data")).ok());
}

INSTANTIATE_TEST_SUITE_P(Disk, DiskFaultsTest, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Tmpfs" : "Shim";
                         });

}  // namespace
}  // namespace attnaudit::testing
