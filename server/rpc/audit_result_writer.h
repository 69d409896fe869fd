// AuditResultWriter: keeps the results of interactive jobs (Audit,
// AuditStream) on a thread of its own, so a store write (an fsync, or a
// round trip to PostgreSQL) never holds the worker that finished the job:
// the next queued audit starts at once. An Audit's answer waits for its
// result to be kept (the caller's `done`), so the job id it carries can
// always be read back: kept means stored, or, when the
// store cannot take it (unreachable, or refusing writes), journalled on
// the replica's disk (ResultJournal, fsync'd) and stored from there as
// soon as the store takes writes again -- then GetResult, ListResults and
// every replica's watchers see it, numbered like any result. A result
// that can be neither (the queue is full, the journal is full or failing,
// or there is no journal) is not kept, and `done` says so.
//
// Modes. While the store answers, results are stored in order, those
// waiting together in one transaction (JobStore::PutResults: one commit
// for up to kBatch results, so a store whose commit waits for a disk
// flush keeps up with the audits). After a
// store failure, and while the journal holds results, new results go to
// the journal (so no result waits for a store that is away, and they stay
// in order), and the writer stores the journal's oldest results one by
// one at every retry period, or as soon as StoreAnswered() says the store
// is back, until one fails. JournalOnly() (shutdown) sends everything
// still to come to the journal, drained by the next start.
//
// Thread safety: Add, StoreAnswered and JournalOnly from any thread; none
// waits for the store. `store` and `done` run on the writer's thread
// (`done` on Add's when the queue is full). The destructor keeps what is
// queued (journal-only), then joins.
#ifndef ATTNAUDIT_SERVER_RPC_AUDIT_RESULT_WRITER_H_
#define ATTNAUDIT_SERVER_RPC_AUDIT_RESULT_WRITER_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/rpc/result_journal.h"
#include "server/store/job_store.h"

namespace attnaudit::server {

class AuditResultWriter {
 public:
  // Stores results, all or none (the store's error when it cannot).
  using Store = std::function<absl::Status(const std::vector<ResultRecord>&)>;
  // Once per result: whether it is kept (stored or journalled).
  using Done = std::function<void(const ResultRecord& record, bool kept)>;

  struct Options {
    size_t capacity = 4096;  // results waiting at most
    absl::Duration retry_period = absl::Seconds(1);
  };
  // Results stored in one transaction at most.
  static constexpr size_t kBatch = 64;

  // `journal` (not owned, outlives the writer) may be null: a result the
  // store refuses is then not kept.
  AuditResultWriter(Options options, Store store, ResultJournal* journal);
  ~AuditResultWriter();
  AuditResultWriter(const AuditResultWriter&) = delete;
  AuditResultWriter& operator=(const AuditResultWriter&) = delete;

  void Add(ResultRecord record, Done done);
  // The store answered a read: drain the journal now rather than at the
  // next retry period.
  void StoreAnswered();
  // From now on every result goes to the journal (shutdown).
  void JournalOnly();
  // Results refused because the queue was full, and results in the
  // journal (waiting for the store).
  int64_t overflowed() const;
  int64_t journalled() const;

 private:
  struct Item {
    ResultRecord record;
    Done done;
  };
  void Loop();
  // Keeps results (see Modes) and tells each its `done`.
  void KeepAll(std::vector<Item> items);
  bool Journal(const ResultRecord& record);
  // Stores the journal's results, oldest first, until one fails.
  void DrainJournal();
  bool JournalModeLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const Options options_;
  const Store store_;
  ResultJournal* const journal_;
  mutable absl::Mutex mu_;
  std::deque<Item> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool journal_only_ ABSL_GUARDED_BY(mu_) = false;
  bool drain_now_ ABSL_GUARDED_BY(mu_) = false;
  // A store write failed and the journal was not drained since (logs).
  bool store_down_ ABSL_GUARDED_BY(mu_) = false;
  int64_t journalled_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t overflowed_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace attnaudit::server

#endif  // ATTNAUDIT_SERVER_RPC_AUDIT_RESULT_WRITER_H_
