#include "server/app/data_dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace attnaudit::server {
namespace {

// The pid the holder wrote ("?" when the file says nothing readable).
std::string HolderOf(int fd) {
  char buf[32] = {};
  const ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
  std::string pid(buf, n > 0 ? static_cast<size_t>(n) : 0);
  pid = std::string(absl::StripAsciiWhitespace(pid));
  return pid.empty() ? "?" : pid;
}

}  // namespace

absl::StatusOr<std::unique_ptr<DataDirLock>> DataDirLock::Acquire(
    const std::string& dir) {
  const std::string path = dir + "/lock";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("--data-dir ", dir,
                                            ": cannot open ", path, ": ",
                                            std::strerror(errno)));
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    std::string holder = HolderOf(fd);
    ::close(fd);
    if (err == EWOULDBLOCK) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--data-dir ", dir, ": in use by another attnaudit-server (pid ",
          holder,
          "); every server needs a data directory of its own (stop the other "
          "one, or give this one another --data-dir)"));
    }
    return absl::InternalError(absl::StrCat(
        "--data-dir ", dir, ": cannot lock ", path, ": ", std::strerror(err)));
  }
  // Ours: say who holds it (best effort; the lock is what protects).
  const std::string pid = absl::StrCat(::getpid(), "\n");
  if (::ftruncate(fd, 0) == 0) {
    (void)!::pwrite(fd, pid.data(), pid.size(), 0);
  }
  return std::unique_ptr<DataDirLock>(new DataDirLock(path, fd));
}

DataDirLock::~DataDirLock() {
  ::flock(fd_, LOCK_UN);
  ::close(fd_);
}

}  // namespace attnaudit::server
