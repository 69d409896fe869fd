// DataDirLock: the server's exclusive hold on its --data-dir. Two servers
// on one data directory would both resume the same spool (running every
// spooled job twice), write one results.db and delete each other's spool
// entries; so the server that uses a directory locks it for as long as it
// runs, and a second one refuses to start.
//
// The lock is flock(LOCK_EX | LOCK_NB) on <data-dir>/lock, held by an
// open descriptor: the kernel releases it when the process ends however
// it ends (kill -9 included), so a stale lock file never blocks a
// restart. The holder writes its pid into the file, which the refusal
// quotes. Locks are per open file (not per process), so two servers
// embedded in one process (tests) exclude each other too. flock does not
// reach across NFS clients on every system: a data directory on a shared
// file system is not protected by it.
//
// Errors: FailedPrecondition "--data-dir DIR: in use by another
// attnaudit-server (pid N); ..." when another holder has it, Internal (with
// the errno text) when the file cannot be opened or locked.
//
// Thread safety: not shared; Acquire once, and the object releases the lock
// when destroyed.
#ifndef ATTNAUDIT_SERVER_APP_DATA_DIR_LOCK_H_
#define ATTNAUDIT_SERVER_APP_DATA_DIR_LOCK_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace attnaudit::server {

class DataDirLock {
 public:
  // Creates <dir>/lock if needed and locks it. `dir` must exist.
  static absl::StatusOr<std::unique_ptr<DataDirLock>> Acquire(
      const std::string& dir);
  ~DataDirLock();
  DataDirLock(const DataDirLock&) = delete;
  DataDirLock& operator=(const DataDirLock&) = delete;

  const std::string& path() const { return path_; }

 private:
  DataDirLock(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  const std::string path_;
  const int fd_;
};

}  // namespace attnaudit::server

#endif  // ATTNAUDIT_SERVER_APP_DATA_DIR_LOCK_H_
