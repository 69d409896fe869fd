// Spool: the durable queue of accepted Submit jobs, one file per job under
// <data_dir>/spool. The RPC layer acknowledges a Submit only after Put has
// returned OK, removes the entry after the job's result is committed to the
// store, and resumes List()'s entries at start-up. The payload (the
// serialised snapshot/request) is opaque bytes.
//
// Durability protocol of Put: write <id>.tmp, fsync it, rename it to
// <id>.job, fsync the directory. A crash at any point leaves either no
// <id>.job or a complete one; leftover *.tmp files are deleted by Open.
//
// File format (little-endian), checked on every read:
//   "AASPOOL1" (8 bytes) | u32 format version | u32 metadata length m |
//   u64 payload length n | metadata (m bytes) | payload (n bytes) |
//   u32 CRC-32C of everything before it
// Put writes version 2, whose metadata is a serialised SpoolRecordMetadata
// (spool_record.proto: fields are only added, an older entry reads with
// the defaults of newer ones). Entries of version 1, written before, still
// read: their metadata is little-endian fields, the tenant last and
// missing from entries spooled before tenants existed. The payload stays
// outside the message: it may exceed protobuf's 2 GiB message limit, and
// it is read straight into its buffer.
// A file whose size, magic, version or CRC does not match is corrupt: List
// renames it to <id>.corrupt (kept for inspection, never listed again) and
// skips it; Read does the same and returns DataLoss.
//
// Job ids are file names: 1-128 characters of [A-Za-z0-9_.-], not starting
// with '.'; anything else is InvalidArgument("job_id: ...").
//
// Thread safety: all methods are thread-safe. Concurrent Puts of different
// ids run in parallel; a Put of an id that exists or is being written fails
// AlreadyExists.
#ifndef ATTNAUDIT_SERVER_SPOOL_SPOOL_H_
#define ATTNAUDIT_SERVER_SPOOL_SPOOL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace attnaudit::server {

// Small, fixed metadata stored next to the payload, so a resumed job can be
// rescheduled without parsing the payload first.
struct SpoolMetadata {
  int32_t priority = 1;                    // PriorityClass value (1 = SAMPLED)
  absl::Time created = absl::UnixEpoch();  // when Submit arrived
  absl::Time deadline = absl::InfiniteFuture();  // none
  std::string model;                             // labels, for logs
  int64_t layer = -1;
  std::string engine;
  std::string attributes;  // opaque to the spool (e.g. serialised options)
  // Owner of the job. Written after the fields above; entries spooled
  // before tenants existed read as "default".
  std::string tenant = "default";
};

struct SpoolEntry {
  std::string job_id;
  SpoolMetadata metadata;
  std::string payload;
};

// What List() found, in creation order (oldest first, by metadata.created,
// then id), without the payloads.
struct SpoolListing {
  std::string job_id;
  SpoolMetadata metadata;
  int64_t payload_bytes = 0;
};

struct SpoolOptions {
  // The folder under data_dir that holds the entries. The job spool is
  // "spool"; the RPC layer keeps a second spool, "journal", of results the
  // store could not take (server/jobs/result_journal.h).
  std::string subdir = "spool";
  // Refuse Put (ResourceExhausted) when the spool's files would exceed this
  // many bytes in total. 0: no limit.
  int64_t max_total_bytes = 0;
  // Refuse Put (InvalidArgument) above this payload size and treat larger
  // declared sizes as corrupt when reading. Bounds what a read allocates.
  int64_t max_payload_bytes = int64_t{4} << 30;
  // Tests only: skip fsync (the protocol is otherwise unchanged).
  bool sync = true;
};

class Spool {
 public:
  // Creates <data_dir>/<subdir> (and data_dir) when missing, deletes leftover
  // *.tmp files and sizes the existing entries. Errors: Internal/
  // PermissionDenied-like errors from the file system, with the path.
  static absl::StatusOr<std::unique_ptr<Spool>> Open(
      const std::string& data_dir, const SpoolOptions& options = {});

  // Stores the job durably; returns only once <id>.job and its directory
  // entry are on disk. AlreadyExists when the id is spooled; on any error
  // nothing is left behind.
  absl::Status Put(absl::string_view job_id, const SpoolMetadata& metadata,
                   absl::string_view payload);

  // Reads and verifies one entry. NotFound when absent; DataLoss when
  // corrupt (the file is renamed to .corrupt).
  absl::StatusOr<SpoolEntry> Read(absl::string_view job_id);

  // The entry's metadata only (header and size checked, no CRC, nothing
  // quarantined: Read or List decide about a corrupt file). NotFound when
  // absent; DataLoss when the header does not decode.
  absl::StatusOr<SpoolMetadata> ReadMetadata(absl::string_view job_id);

  // Every valid entry (header and size checked; the CRC is checked by Read,
  // or here too when verify_crc). Corrupt files are renamed and skipped.
  absl::StatusOr<std::vector<SpoolListing>> List(bool verify_crc = false);

  // Deletes the entry and syncs the directory. OK when already absent
  // (idempotent: resume may race with a late Remove).
  absl::Status Remove(absl::string_view job_id);

  bool Contains(absl::string_view job_id);
  int64_t total_bytes() const;
  const std::string& dir() const { return dir_; }

 private:
  Spool(std::string dir, const SpoolOptions& options);
  std::string PathOf(absl::string_view job_id, absl::string_view ext) const;
  absl::Status Quarantine(absl::string_view job_id);

  const std::string dir_;
  const SpoolOptions options_;
  mutable absl::Mutex mu_;
  int64_t total_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // Sizes of entries on disk, to keep total_bytes_ exact on Remove.
  absl::flat_hash_map<std::string, int64_t> sizes_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<std::string> writing_ ABSL_GUARDED_BY(mu_);
};

// Validates a job id as described above (exposed for the RPC layer, which
// generates and accepts ids).
absl::Status ValidateJobId(absl::string_view job_id);

// CRC-32C (Castagnoli), hardware-accelerated where SSE4.2 is available.
// `crc` is the running value (0 to start).
uint32_t Crc32c(uint32_t crc, const void* data, size_t size);

}  // namespace attnaudit::server

#endif  // ATTNAUDIT_SERVER_SPOOL_SPOOL_H_
