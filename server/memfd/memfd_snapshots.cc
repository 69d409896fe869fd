#include "server/memfd/memfd_snapshots.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/common/status_macros.h"
#include "proto/codec/codec.h"
#include "transport/boot_id/boot_id.h"

namespace attnaudit::server {
namespace {

constexpr char kPathField[] = "snapshot_memfd.path";

// "/proc/<pid>/fd/<n>" with decimal pid and n: the one form a client names
// its own memfd by. Anything else is refused before the file system is
// touched.
bool IsProcFdPath(const std::string& path) {
  const std::vector<absl::string_view> parts = absl::StrSplit(path, '/');
  if (parts.size() != 5 || !parts[0].empty() || parts[1] != "proc" ||
      parts[3] != "fd") {
    return false;
  }
  for (absl::string_view number : {parts[2], parts[4]}) {
    uint32_t unused = 0;
    if (number.empty() || number.size() > 10 ||
        !std::all_of(number.begin(), number.end(), absl::ascii_isdigit) ||
        !absl::SimpleAtoi(number, &unused)) {
      return false;
    }
  }
  return true;
}

absl::Status OpenError(int error, const std::string& path) {
  const std::string message =
      absl::StrCat(kPathField, ": cannot open ", path, ": ", strerror(error));
  switch (error) {
    case ENOENT:
      return absl::NotFoundError(message);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(message);
    default:
      return absl::InvalidArgumentError(message);
  }
}

// The open file must be a regular file sealed against shrinking.
absl::Status CheckSealed(int fd, const struct stat& st,
                         const std::string& path) {
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(kPathField, ": ", path, " is not a regular file"));
  }
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        kPathField, ": ", path,
        " is not a memfd sealed against shrinking (F_SEAL_SHRINK); a file "
        "that may shrink cannot be read in place safely"));
  }
  return absl::OkStatus();
}

class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() { ::close(fd_); }
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;

 private:
  const int fd_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<MemfdSnapshots>> MemfdSnapshots::Create(
    MemfdSnapshotOptions options) {
  if (options.max_bytes < 1 || options.max_mappings < 1 ||
      options.max_mapped_bytes < 1 ||
      options.idle_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "memfd snapshots: limits and the idle timeout must be positive");
  }
  ATTNAUDIT_ASSIGN_OR_RETURN(std::string boot_id, ReadBootId());
  return std::unique_ptr<MemfdSnapshots>(
      new MemfdSnapshots(options, std::move(boot_id)));
}

absl::StatusOr<Snapshot> MemfdSnapshots::Open(const MemfdRef& ref) {
  const std::string& path = ref.path;
  const int64_t bytes = ref.bytes;
  if (!IsProcFdPath(path)) {
    return absl::InvalidArgumentError(
        absl::StrCat(kPathField, ": expected /proc/<pid>/fd/<fd>, got \"",
                     path.substr(0, 64), "\""));
  }
  if (bytes < 1 || bytes > options_.max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("snapshot_memfd.bytes: ", bytes, " is outside [1, ",
                     options_.max_bytes, "] (--max-message-bytes)"));
  }
  if (ref.boot_id != boot_id_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "snapshot_memfd.boot_id: the client runs on another kernel (boot id "
        "\"",
        ref.boot_id.substr(0, 40),
        "\") than this server; a memfd can "
        "only be handed to a server on the same machine"));
  }
  // The type is checked before the open: opening a FIFO would wait for a
  // writer, and a device might act on it. O_NONBLOCK covers a swap of the
  // descriptor between the two calls, which the inode comparison catches.
  struct stat before;
  if (::stat(path.c_str(), &before) != 0) return OpenError(errno, path);
  if (static_cast<uint64_t>(before.st_ino) != ref.inode) {
    return absl::FailedPreconditionError(absl::StrCat(
        "snapshot_memfd.inode: ", path, " is another file here (inode ",
        before.st_ino, ", the client's memfd is ", ref.inode,
        "): are the client and the server in different PID namespaces?"));
  }
  if (!S_ISREG(before.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(kPathField, ": ", path, " is not a regular file"));
  }
  const int fd =
      ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) return OpenError(errno, path);
  FdCloser closer(fd);
  struct stat st;
  if (::fstat(fd, &st) != 0) return OpenError(errno, path);
  if (st.st_dev != before.st_dev || st.st_ino != before.st_ino) {
    return absl::InvalidArgumentError(absl::StrCat(
        kPathField, ": ", path, " changed while it was being opened"));
  }
  ATTNAUDIT_RETURN_IF_ERROR(CheckSealed(fd, st, path));
  if (bytes > st.st_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("snapshot_memfd.bytes: ", bytes, " is past the end of ",
                     path, " (", st.st_size, " bytes)"));
  }
  ATTNAUDIT_ASSIGN_OR_RETURN(
      std::shared_ptr<const void> memory,
      MappingOf(fd, st.st_dev, st.st_ino, st.st_size, path));
  const absl::string_view file(static_cast<const char*>(memory.get()),
                               static_cast<size_t>(bytes));
  absl::StatusOr<Snapshot> snapshot = DecodeMappedSnapshot(file, memory);
  if (!snapshot.ok()) {
    return absl::Status(
        snapshot.status().code(),
        absl::StrCat("snapshot_memfd: ", snapshot.status().message()));
  }
  return snapshot;
}

absl::StatusOr<std::shared_ptr<const void>> MemfdSnapshots::MappingOf(
    int fd, uint64_t device, uint64_t inode, int64_t size,
    const std::string& path) {
  absl::MutexLock lock(&mu_);
  for (auto it = mappings_.begin(); it != mappings_.end(); ++it) {
    if (it->device != device || it->inode != inode) continue;
    if (it->size >= size) {
      it->last_used = absl::Now();
      mappings_.splice(mappings_.begin(), mappings_, it);
      return mappings_.front().memory;
    }
    mappings_.erase(it);  // the memfd grew: map it anew
    break;
  }
  // MAP_SHARED: the client's later writes to the same memfd are what the
  // next audit through this mapping reads.
  void* mapped =
      ::mmap(nullptr, static_cast<size_t>(size), PROT_READ, MAP_SHARED, fd, 0);
  if (mapped == MAP_FAILED) {
    return absl::InvalidArgumentError(
        absl::StrCat(kPathField, ": cannot map ", path, ": ", strerror(errno)));
  }
  const size_t length = static_cast<size_t>(size);
  Mapping m;
  m.device = device;
  m.inode = inode;
  m.size = size;
  m.memory = std::shared_ptr<const void>(mapped, [length](const void* p) {
    ::munmap(const_cast<void*>(p), length);
  });
  m.last_used = absl::Now();
  mappings_.push_front(std::move(m));
  EvictBeyondLimits();
  return mappings_.front().memory;
}

void MemfdSnapshots::EvictBeyondLimits() {
  int64_t total = 0;
  int count = 0;
  for (auto it = mappings_.begin(); it != mappings_.end();) {
    total += it->size;
    ++count;
    // The newest is always kept: it is being returned.
    if (count > 1 &&
        (count > options_.max_mappings || total > options_.max_mapped_bytes)) {
      total -= it->size;
      --count;
      it = mappings_.erase(it);
    } else {
      ++it;
    }
  }
}

void MemfdSnapshots::DropIdle() {
  const absl::Time cutoff = absl::Now() - options_.idle_timeout;
  absl::MutexLock lock(&mu_);
  mappings_.remove_if(
      [cutoff](const Mapping& m) { return m.last_used < cutoff; });
}

int MemfdSnapshots::mappings() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(mappings_.size());
}

}  // namespace attnaudit::server
