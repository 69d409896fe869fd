// AuditResultWriter: stores the results of interactive jobs (Audit,
// AuditStream) on a thread of its own, so a store write (an fsync, or a
// round trip to PostgreSQL) never holds the worker that finished the job:
// the next queued audit starts at once. The queue is bounded; a result
// that finds it full is handed to `overflow` instead (published to the
// watchers of the moment, not stored) -- the caller already has its report.
//
// Thread safety: Add from any thread; it never blocks on the store. The
// destructor stores what is queued, then joins.
#ifndef ATTNAUDIT_SERVER_RPC_AUDIT_RESULT_WRITER_H_
#define ATTNAUDIT_SERVER_RPC_AUDIT_RESULT_WRITER_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "server/store/job_store.h"

namespace attnaudit::server {

class AuditResultWriter {
 public:
  using Sink = std::function<void(ResultRecord)>;

  AuditResultWriter(size_t capacity, Sink write, Sink overflow);
  ~AuditResultWriter();
  AuditResultWriter(const AuditResultWriter&) = delete;
  AuditResultWriter& operator=(const AuditResultWriter&) = delete;

  void Add(ResultRecord record);
  // Results handed to `overflow` so far.
  int64_t overflowed() const;

 private:
  void Loop();

  const size_t capacity_;
  const Sink write_;
  const Sink overflow_;
  mutable absl::Mutex mu_;
  std::deque<ResultRecord> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int64_t overflowed_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace attnaudit::server

#endif  // ATTNAUDIT_SERVER_RPC_AUDIT_RESULT_WRITER_H_
