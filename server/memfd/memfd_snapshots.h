// MemfdSnapshots: snapshots that a client on the server's machine hands over
// in a memfd (AuditRequest.snapshot_memfd) instead of over the wire. The
// server opens the memfd through /proc/<client pid>/fd/<fd>, maps it
// read-only and decodes the snapshot in place (proto/codec
// DecodeMappedSnapshot): no byte crosses a socket or is copied.
//
//   ATTNAUDIT_ASSIGN_OR_RETURN(auto memfds, MemfdSnapshots::Create({}));
//   absl::StatusOr<Snapshot> s =
//       memfds->Open({"/proc/123/fd/7", bytes, boot_id, inode});
//
// Same machine, same file. /proc/<pid>/fd/<n> names another process's file
// on another machine, or in another PID namespace of this one; auditing
// that instead would be a wrong report, so the client also sends its
// kernel's boot id and the memfd's inode number, and both must match
// (FailedPrecondition otherwise).
//
// Safety. Only a file the client sealed against shrinking (F_SEAL_SHRINK)
// is read: a mapped file that shrank under a reader would kill it with
// SIGBUS, and a sealed one cannot. Ordinary files (which cannot be sealed)
// are refused, so the field cannot make the server read its own files. The
// client may still write the memfd while the audit runs; that only spoils
// its own result (the contract: do not touch it until the answer comes).
//
// Mappings are kept (keyed by the memfd's device and inode) and reused
// while the client keeps sending the same memfd, so the pages are mapped
// once, not per audit: the point of the path (docs/PERF.md). A kept
// mapping also keeps the memfd's memory alive after the client closes it,
// so mappings are dropped when unused for `idle_timeout` (DropIdle, called
// by the server's reclaimer) and the least recently used beyond
// `max_mappings` or `max_mapped_bytes` are dropped at once. Tensors of a
// returned Snapshot hold their mapping: a dropped entry is unmapped when
// its last audit ends.
//
// Thread safety: all methods are thread-safe. Errors (the field named):
//   InvalidArgument  "snapshot_memfd.path: ..." not a /proc/<pid>/fd/<n>
//                    path, not a regular file, not sealed against
//                    shrinking; "snapshot_memfd.bytes: ..." out of range
//   NotFound / PermissionDenied  "snapshot_memfd.path: cannot open ..."
//   InvalidArgument  "snapshot_memfd: not a valid attnaudit.v1.Snapshot ..."
//   FailedPrecondition "snapshot_memfd.boot_id: ..." another kernel;
//                    "snapshot_memfd.inode: ..." another file at the path
#ifndef ATTNAUDIT_SERVER_MEMFD_MEMFD_SNAPSHOTS_H_
#define ATTNAUDIT_SERVER_MEMFD_MEMFD_SNAPSHOTS_H_

#include <cstdint>
#include <list>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/snapshot/snapshot.h"

namespace attnaudit::server {

// What a request names (AuditRequest.snapshot_memfd).
struct MemfdRef {
  std::string path;     // /proc/<pid>/fd/<n>
  int64_t bytes = 0;    // the snapshot's length at the start of the memfd
  std::string boot_id;  // the client's /proc/sys/kernel/random/boot_id
  uint64_t inode = 0;   // the memfd's st_ino, as the client sees it
};

struct MemfdSnapshotOptions {
  // The largest snapshot accepted (the server's --max-message-bytes, so
  // that a memfd snapshot is no larger than one sent inline).
  int64_t max_bytes = int64_t{256} << 20;
  // Mappings kept for reuse.
  int max_mappings = 16;
  int64_t max_mapped_bytes = int64_t{8} << 30;
  absl::Duration idle_timeout = absl::Seconds(30);
};

class MemfdSnapshots {
 public:
  // InvalidArgument for a non-positive limit; Internal when this kernel's
  // boot id cannot be read.
  static absl::StatusOr<std::unique_ptr<MemfdSnapshots>> Create(
      MemfdSnapshotOptions options);

  // The snapshot in the first ref.bytes bytes of the memfd ref names.
  absl::StatusOr<Snapshot> Open(const MemfdRef& ref);

  // Drops the mappings unused for idle_timeout.
  void DropIdle();

  // Mappings kept now (for tests and metrics).
  int mappings() const;

 private:
  struct Mapping {
    uint64_t device = 0;
    uint64_t inode = 0;
    int64_t size = 0;  // bytes mapped
    std::shared_ptr<const void> memory;
    absl::Time last_used;
  };

  MemfdSnapshots(MemfdSnapshotOptions options, std::string boot_id)
      : options_(options), boot_id_(std::move(boot_id)) {}
  // The kept mapping of the file open at fd (stat'ed as device/inode/size),
  // covering at least `bytes`; maps it anew when there is none.
  absl::StatusOr<std::shared_ptr<const void>> MappingOf(
      int fd, uint64_t device, uint64_t inode, int64_t size,
      const std::string& path);
  void EvictBeyondLimits() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const MemfdSnapshotOptions options_;
  const std::string boot_id_;
  mutable absl::Mutex mu_;
  std::list<Mapping> mappings_ ABSL_GUARDED_BY(mu_);  // most recent first
};

}  // namespace attnaudit::server

#endif  // ATTNAUDIT_SERVER_MEMFD_MEMFD_SNAPSHOTS_H_
