// ResultJournal: results of finished jobs that the store could not take
// (it was unreachable, or refused the write), kept on the replica's own
// disk until it takes them, so that an Audit answered with a job id can be
// read back with GetResult, ListResults and resumed watches once the store
// is back. AuditResultWriter (audit_result_writer.h) writes
// and drains it.
//
// Each result is one entry of a Spool under <data-dir>/journal (the spool's
// protocol: write, fsync, rename, directory fsync, a CRC-32C per file), so
// a journalled result survives a crash of the replica and is drained after
// its restart. Its payload is the result as a JournalledResult message
// (server/spool/spool_record.proto). The journal is bounded: Append
// refuses (ResourceExhausted) a result that would take it past max_bytes,
// and the caller then says the result was not stored. An entry that fails
// its checks is quarantined by the spool (<id>.corrupt) and skipped.
//
// Thread safety: all methods are thread-safe.
#ifndef ATTNAUDIT_SERVER_RPC_RESULT_JOURNAL_H_
#define ATTNAUDIT_SERVER_RPC_RESULT_JOURNAL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/spool/spool.h"
#include "server/store/job_store.h"

namespace attnaudit::server {

class ResultJournal {
 public:
  struct Options {
    // Bytes of journal files at most (each a result: its report and a
    // few hundred bytes). >= 1.
    int64_t max_bytes = int64_t{256} << 20;
    // Tests only: skip fsync.
    bool sync = true;
  };

  // Opens (creating) <data_dir>/journal with what an earlier run left.
  static absl::StatusOr<std::unique_ptr<ResultJournal>> Open(
      const std::string& data_dir, const Options& options);

  // Keeps `record` (terminal) durably: returns once it is on disk.
  // ResourceExhausted when the journal is full, the spool's error else.
  absl::Status Append(const ResultRecord& record);
  // The journalled results' ids, oldest first (the order to store them).
  absl::StatusOr<std::vector<std::string>> Ids();
  // One journalled result; NotFound when it is not (or no longer) here,
  // DataLoss when its file is corrupt (then quarantined).
  absl::StatusOr<ResultRecord> Read(absl::string_view job_id);
  bool Contains(absl::string_view job_id) { return spool_->Contains(job_id); }
  // Drops a result the store took (idempotent).
  absl::Status Remove(absl::string_view job_id);
  int64_t bytes() const { return spool_->total_bytes(); }

 private:
  explicit ResultJournal(std::unique_ptr<Spool> spool)
      : spool_(std::move(spool)) {}
  std::unique_ptr<Spool> spool_;
};

}  // namespace attnaudit::server

#endif  // ATTNAUDIT_SERVER_RPC_RESULT_JOURNAL_H_
