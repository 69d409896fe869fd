// A fault-injection shim for the disk-fault tests, loaded with LD_PRELOAD
// where a small tmpfs cannot be mounted (a CI container without
// CAP_SYS_ADMIN). It makes a directory behave like a full (ENOSPC) or
// read-only (EROFS) file system while a control file exists:
//
//   $ATTNAUDIT_FAULT_FILE holds two lines: "ENOSPC" or "EROFS", then the
//   absolute directory prefix. While the file exists, writes to files under
//   the prefix fail with that errno, and with EROFS so do opens for
//   writing. Deleting the file makes the "disk" healthy again.
//
// Everything else passes straight through; the control file is looked at
// at most every 2 ms. Test code only: never linked into the server.
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

namespace {

pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
long long next_check_ns;
int fault_errno;  // 0: healthy
char prefix[PATH_MAX];

long long NowNs(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

// The errno to inject now (0: none), re-reading the control file.
int Fault(char* dir, size_t n) {
  const char* file = getenv("ATTNAUDIT_FAULT_FILE");
  if (file == NULL) return 0;
  pthread_mutex_lock(&mu);
  const long long now = NowNs();
  if (now >= next_check_ns) {
    next_check_ns = now + 2000000;
    fault_errno = 0;
    static auto* real_read = reinterpret_cast<ssize_t (*)(int, void*, size_t)>(
        dlsym(RTLD_NEXT, "read"));
    static auto* real_open = reinterpret_cast<int (*)(const char*, int, ...)>(
        dlsym(RTLD_NEXT, "open"));
    const int fd = real_open(file, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
      char buf[PATH_MAX + 32];
      const ssize_t got = real_read(fd, buf, sizeof(buf) - 1);
      close(fd);
      if (got > 0) {
        buf[got] = '\0';
        char* nl = strchr(buf, '\n');
        if (nl != NULL) {
          *nl = '\0';
          char* p = nl + 1;
          char* end = strchr(p, '\n');
          if (end != NULL) *end = '\0';
          snprintf(prefix, sizeof(prefix), "%s", p);
          fault_errno = strcmp(buf, "EROFS") == 0 ? EROFS : ENOSPC;
        }
      }
    }
  }
  const int e = fault_errno;
  if (e != 0 && dir != NULL) snprintf(dir, n, "%s", prefix);
  pthread_mutex_unlock(&mu);
  return e;
}

int Under(const char* path, const char* dir) {
  const size_t n = strlen(dir);
  return n > 0 && strncmp(path, dir, n) == 0;
}

// errno to fail this write to `fd` with, or 0.
int FdFault(int fd) {
  char dir[PATH_MAX];
  const int e = Fault(dir, sizeof(dir));
  if (e == 0) return 0;
  char link[64], path[PATH_MAX];
  snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
  const ssize_t n = readlink(link, path, sizeof(path) - 1);
  if (n <= 0) return 0;
  path[n] = '\0';
  return Under(path, dir) ? e : 0;
}

// Opens for writing under the prefix fail on a read-only "disk".
int OpenFault(const char* path, int flags) {
  if ((flags & (O_WRONLY | O_RDWR | O_CREAT | O_TRUNC)) == 0) return 0;
  char dir[PATH_MAX];
  const int e = Fault(dir, sizeof(dir));
  if (e != EROFS || path == NULL) return 0;
  char abs[PATH_MAX];
  if (path[0] != '/') {
    if (getcwd(abs, sizeof(abs)) == NULL) return 0;
    strncat(abs, "/", sizeof(abs) - strlen(abs) - 1);
    strncat(abs, path, sizeof(abs) - strlen(abs) - 1);
    path = abs;
  }
  return Under(path, dir) ? e : 0;
}

}  // namespace

#define REAL(name)           \
  static auto* real_##name = \
      reinterpret_cast<decltype(&name)>(dlsym(RTLD_NEXT, #name))

extern "C" {

ssize_t write(int fd, const void* buf, size_t count) {
  REAL(write);
  const int e = FdFault(fd);
  if (e != 0) {
    errno = e;
    return -1;
  }
  return real_write(fd, buf, count);
}

ssize_t pwrite(int fd, const void* buf, size_t count, off_t offset) {
  REAL(pwrite);
  const int e = FdFault(fd);
  if (e != 0) {
    errno = e;
    return -1;
  }
  return real_pwrite(fd, buf, count, offset);
}

ssize_t pwrite64(int fd, const void* buf, size_t count, off64_t offset) {
  REAL(pwrite64);
  const int e = FdFault(fd);
  if (e != 0) {
    errno = e;
    return -1;
  }
  return real_pwrite64(fd, buf, count, offset);
}

ssize_t writev(int fd, const struct iovec* iov, int iovcnt) {
  REAL(writev);
  const int e = FdFault(fd);
  if (e != 0) {
    errno = e;
    return -1;
  }
  return real_writev(fd, iov, iovcnt);
}

int fallocate(int fd, int mode, off_t offset, off_t len) {
  REAL(fallocate);
  const int e = FdFault(fd);
  if (e != 0) {
    errno = e;
    return -1;
  }
  return real_fallocate(fd, mode, offset, len);
}

int posix_fallocate(int fd, off_t offset, off_t len) {
  REAL(posix_fallocate);
  const int e = FdFault(fd);
  if (e != 0) return e;
  return real_posix_fallocate(fd, offset, len);
}

int open(const char* path, int flags, ...) {
  REAL(open);
  mode_t mode = 0;
  if (flags & (O_CREAT | O_TMPFILE)) {
    va_list ap;
    va_start(ap, flags);
    mode = va_arg(ap, mode_t);
    va_end(ap);
  }
  const int e = OpenFault(path, flags);
  if (e != 0) {
    errno = e;
    return -1;
  }
  return real_open(path, flags, mode);
}

int open64(const char* path, int flags, ...) {
  REAL(open64);
  mode_t mode = 0;
  if (flags & (O_CREAT | O_TMPFILE)) {
    va_list ap;
    va_start(ap, flags);
    mode = va_arg(ap, mode_t);
    va_end(ap);
  }
  const int e = OpenFault(path, flags);
  if (e != 0) {
    errno = e;
    return -1;
  }
  return real_open64(path, flags, mode);
}

int openat(int dirfd, const char* path, int flags, ...) {
  REAL(openat);
  mode_t mode = 0;
  if (flags & (O_CREAT | O_TMPFILE)) {
    va_list ap;
    va_start(ap, flags);
    mode = va_arg(ap, mode_t);
    va_end(ap);
  }
  const int e = dirfd == AT_FDCWD ? OpenFault(path, flags) : 0;
  if (e != 0) {
    errno = e;
    return -1;
  }
  return real_openat(dirfd, path, flags, mode);
}

}  // extern "C"
