// MemfdSnapshots: only sealed memfds named /proc/<pid>/fd/<n> are read,
// every refusal names its field, the decoded snapshot is the one written,
// and kept mappings are reused, replaced when the memfd grows, dropped
// when idle or past the limits, and never pulled from under an audit.
#include "server/memfd/memfd_snapshots.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/lib/memfd_snapshot.h"
#include "gtest/gtest.h"
#include "sim/simulator.h"
#include "transport/boot_id/boot_id.h"

namespace attnaudit::server {
namespace {

Snapshot Synth(int64_t context, uint64_t seed) {
  SynthOptions o;
  o.preset = "llama3-8b";
  o.context = context;
  o.vocab = 16;
  o.seed = seed;
  o.threads = 1;
  absl::StatusOr<Snapshot> s = Synthesize(o);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *std::move(s) : Snapshot();
}

std::unique_ptr<MemfdSnapshots> Make(MemfdSnapshotOptions o = {}) {
  absl::StatusOr<std::unique_ptr<MemfdSnapshots>> m = MemfdSnapshots::Create(o);
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? *std::move(m) : nullptr;
}

std::string ProcPath(int fd) {
  return absl::StrCat("/proc/", getpid(), "/fd/", fd);
}

std::string BootId() {
  absl::StatusOr<std::string> id = ReadBootId();
  EXPECT_TRUE(id.ok()) << id.status();
  return id.ok() ? *id : "";
}

// A reference to any open file of this process, as a client would send it.
MemfdRef RefTo(int fd, int64_t bytes) {
  struct stat st;
  EXPECT_EQ(fstat(fd, &st), 0);
  return {ProcPath(fd), bytes, BootId(), static_cast<uint64_t>(st.st_ino)};
}

// What a client's MemfdSnapshot describes.
MemfdRef Ref(const client::MemfdSnapshot& m) {
  v1::AuditRequest request;
  m.Describe(&request);
  const v1::MemfdSnapshot& r = request.snapshot_memfd();
  return {r.path(), r.bytes(), r.boot_id(), r.inode()};
}

bool SameTensor(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         a.bytes() == b.bytes();
}

void ExpectRefused(MemfdSnapshots* m, const MemfdRef& ref,
                   absl::StatusCode code, const std::string& field) {
  absl::StatusOr<Snapshot> s = m->Open(ref);
  ASSERT_FALSE(s.ok()) << ref.path;
  EXPECT_EQ(s.status().code(), code) << s.status();
  EXPECT_TRUE(absl::StartsWith(s.status().message(), field)) << s.status();
}

TEST(MemfdSnapshotsTest, ReadsTheSnapshotASealedMemfdHolds) {
  const Snapshot want = Synth(100, 1);
  auto memfd = client::MemfdSnapshot::Create(want);
  ASSERT_TRUE(memfd.ok()) << memfd.status();
  auto m = Make();
  absl::StatusOr<Snapshot> got = m->Open(Ref(**memfd));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(SameTensor(got->k_pages, want.k_pages));
  EXPECT_TRUE(SameTensor(got->q, want.q));
  EXPECT_TRUE(SameTensor(got->engine.out, want.engine.out));
  EXPECT_EQ(got->labels.model, want.labels.model);
  EXPECT_EQ(m->mappings(), 1);
}

TEST(MemfdSnapshotsTest, RefusesWhatIsNotASealedMemfdOfTheProcFdForm) {
  auto m = Make();
  const absl::StatusCode bad = absl::StatusCode::kInvalidArgument;
  for (const char* path : {"/etc/passwd", "/proc/self/fd/0", "proc/1/fd/2",
                           "/proc/1/fd/", "/proc/1/fd/2/x", "/proc/../etc/fd/1",
                           "/proc/1/fd/99999999999", "/proc/-1/fd/3", ""}) {
    ExpectRefused(m.get(), {path, 10, BootId(), 1}, bad, "snapshot_memfd.path");
  }
  // A memfd that is not sealed against shrinking.
  const int unsealed = memfd_create("unsealed", MFD_CLOEXEC);
  ASSERT_GE(unsealed, 0);
  ASSERT_EQ(ftruncate(unsealed, 4096), 0);
  ExpectRefused(m.get(), RefTo(unsealed, 10), bad, "snapshot_memfd.path");
  // An ordinary file, which cannot be sealed at all.
  char name[] = "/tmp/attnaudit_memfd_XXXXXX";
  const int regular = mkstemp(name);
  ASSERT_GE(regular, 0);
  ASSERT_EQ(ftruncate(regular, 4096), 0);
  ExpectRefused(m.get(), RefTo(regular, 10), bad, "snapshot_memfd.path");
  unlink(name);
  // A FIFO (opening it would wait for a writer): refused at once.
  const std::string fifo = absl::StrCat(name, ".fifo");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  const int pipe_end = open(fifo.c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(pipe_end, 0);
  ExpectRefused(m.get(), RefTo(pipe_end, 10), bad, "snapshot_memfd.path");
  close(pipe_end);
  unlink(fifo.c_str());
  // No such descriptor.
  ExpectRefused(m.get(), {ProcPath(999999), 10, BootId(), 1},
                absl::StatusCode::kNotFound, "snapshot_memfd.path");
  close(unsealed);
  close(regular);
  EXPECT_EQ(m->mappings(), 0);
}

TEST(MemfdSnapshotsTest, AnotherKernelOrAnotherFileAtThePathIsRefused) {
  // The path means something only on the client's machine and in its PID
  // namespace: a boot id or an inode that is not the opened file's means
  // the server would read someone else's memfd.
  auto memfd = client::MemfdSnapshot::Create(Synth(64, 7));
  ASSERT_TRUE(memfd.ok());
  auto other = client::MemfdSnapshot::Create(Synth(64, 8));
  ASSERT_TRUE(other.ok());
  auto m = Make();
  const absl::StatusCode pre = absl::StatusCode::kFailedPrecondition;
  MemfdRef elsewhere = Ref(**memfd);
  elsewhere.boot_id = "00000000-0000-0000-0000-000000000000";
  ExpectRefused(m.get(), elsewhere, pre, "snapshot_memfd.boot_id");
  MemfdRef swapped = Ref(**memfd);
  swapped.inode = Ref(**other).inode;  // the path names the first memfd
  ExpectRefused(m.get(), swapped, pre, "snapshot_memfd.inode");
  EXPECT_EQ(m->mappings(), 0);
  EXPECT_TRUE(m->Open(Ref(**memfd)).ok());
}

TEST(MemfdSnapshotsTest, RefusesSizesOutsideTheMemfdAndTheLimit) {
  auto memfd = client::MemfdSnapshot::Create(Synth(64, 2));
  ASSERT_TRUE(memfd.ok());
  MemfdSnapshotOptions o;
  o.max_bytes = (*memfd)->bytes() + 1;
  auto m = Make(o);
  const MemfdRef ref = Ref(**memfd);
  const absl::StatusCode bad = absl::StatusCode::kInvalidArgument;
  for (int64_t wrong :
       {int64_t{0}, int64_t{-5}, ref.bytes + 1, ref.bytes + 2}) {
    MemfdRef r = ref;
    r.bytes = wrong;
    ExpectRefused(m.get(), r, bad, "snapshot_memfd.bytes");
  }
  // Bytes that are not a snapshot: named by the field, not a crash.
  MemfdRef cut = ref;
  cut.bytes -= 7;
  ExpectRefused(m.get(), cut, bad, "snapshot_memfd");
  EXPECT_TRUE(m->Open(ref).ok());
}

TEST(MemfdSnapshotsTest, KeptMappingFollowsWritesAndGrowth) {
  const Snapshot a = Synth(96, 3);
  const Snapshot b = Synth(96, 4);     // same shapes, other values
  const Snapshot big = Synth(400, 5);  // the memfd must grow
  auto memfd = client::MemfdSnapshot::Create(a);
  ASSERT_TRUE(memfd.ok());
  auto m = Make();
  for (const Snapshot* want : {&a, &b, &big, &a}) {
    ASSERT_TRUE((*memfd)->Write(*want).ok());
    absl::StatusOr<Snapshot> got = m->Open(Ref(**memfd));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE(SameTensor(got->k_pages, want->k_pages));
    EXPECT_EQ(m->mappings(), 1);  // one memfd: one mapping, replaced
  }
}

TEST(MemfdSnapshotsTest, IdleAndExcessMappingsGoButNotFromUnderAnAudit) {
  MemfdSnapshotOptions o;
  o.max_mappings = 2;
  o.idle_timeout = absl::Milliseconds(50);
  auto m = Make(o);
  const Snapshot s = Synth(64, 6);
  std::unique_ptr<client::MemfdSnapshot> memfds[3];
  Snapshot held;
  for (auto& memfd : memfds) {
    auto created = client::MemfdSnapshot::Create(s);
    ASSERT_TRUE(created.ok());
    memfd = *std::move(created);
    absl::StatusOr<Snapshot> got = m->Open(Ref(*memfd));
    ASSERT_TRUE(got.ok()) << got.status();
    held = *std::move(got);
  }
  EXPECT_EQ(m->mappings(), 2);  // the least recently used went
  absl::SleepFor(absl::Milliseconds(120));
  m->DropIdle();
  EXPECT_EQ(m->mappings(), 0);
  // The last snapshot's tensors still hold their mapping.
  EXPECT_TRUE(SameTensor(held.k_pages, s.k_pages));
}

}  // namespace
}  // namespace attnaudit::server
