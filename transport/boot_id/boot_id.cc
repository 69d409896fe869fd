#include "transport/boot_id/boot_id.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace attnaudit {

absl::StatusOr<std::string> ReadBootId() {
  constexpr char kPath[] = "/proc/sys/kernel/random/boot_id";
  const int fd = ::open(kPath, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::InternalError(
        absl::StrCat(kPath, ": cannot open: ", strerror(errno)));
  }
  char buffer[64];
  const ssize_t n = ::read(fd, buffer, sizeof buffer);
  const int read_errno = errno;
  ::close(fd);
  if (n < 0) {
    return absl::InternalError(
        absl::StrCat(kPath, ": cannot read: ", strerror(read_errno)));
  }
  std::string id(buffer, static_cast<size_t>(n));
  id = id.substr(0, id.find('\n'));
  while (!id.empty() && id.back() == ' ') id.pop_back();
  if (id.empty()) return absl::InternalError(absl::StrCat(kPath, ": empty"));
  return id;
}

}  // namespace attnaudit
