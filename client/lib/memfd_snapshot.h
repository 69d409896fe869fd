// MemfdSnapshot: a snapshot encoded (as in a snapshot file) into a memfd
// that is sealed against shrinking, for AuditRequest.snapshot_memfd: a
// server on the same machine started with --accept-memfd-snapshots reads it
// in place, so no snapshot byte crosses a socket (docs/OPERATIONS.md,
// "Snapshots in shared memory").
//
//   ATTNAUDIT_ASSIGN_OR_RETURN(auto memfd, MemfdSnapshot::Create(snapshot));
//   v1::AuditRequest request;
//   memfd->Describe(&request);  // then Client::AuditUnary(request)
//   ...                          // after the answer: memfd->Write(next)
//
// The server keeps the memfd mapped while it is in use, so sending the same
// MemfdSnapshot again (rewritten with Write, which never shrinks it) costs
// the server no page mapping. Do not Write while an audit of it runs: the
// server would read a mix of the two snapshots.
//
// Ownership: owns the memfd (closed by the destructor). Thread safety:
// Describe may be called concurrently; Write may not overlap anything.
// Errors: Internal naming the system call ("memfd_create: ..."),
// InvalidArgument when the snapshot cannot be encoded (over 2 GiB).
#ifndef ATTNAUDIT_CLIENT_LIB_MEMFD_SNAPSHOT_H_
#define ATTNAUDIT_CLIENT_LIB_MEMFD_SNAPSHOT_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "attnaudit/v1/service.pb.h"
#include "core/snapshot/snapshot.h"

namespace attnaudit::client {

class MemfdSnapshot {
 public:
  static absl::StatusOr<std::unique_ptr<MemfdSnapshot>> Create(
      const Snapshot& snapshot);
  ~MemfdSnapshot();
  MemfdSnapshot(const MemfdSnapshot&) = delete;
  MemfdSnapshot& operator=(const MemfdSnapshot&) = delete;

  // Replaces the content with `snapshot` (the memfd grows when needed).
  absl::Status Write(const Snapshot& snapshot);

  // Sets request->snapshot_memfd to this memfd and clears request->snapshot.
  void Describe(v1::AuditRequest* request) const;

  int64_t bytes() const { return bytes_; }

 private:
  explicit MemfdSnapshot(int fd) : fd_(fd) {}

  const int fd_;
  // What the server checks to be sure it opened this very memfd: this
  // kernel's boot id and the memfd's inode number.
  std::string boot_id_;
  uint64_t inode_ = 0;
  int64_t bytes_ = 0;  // of the snapshot now in the memfd
  int64_t size_ = 0;   // of the memfd
};

}  // namespace attnaudit::client

#endif  // ATTNAUDIT_CLIENT_LIB_MEMFD_SNAPSHOT_H_
