// ResultFeed: follows the store's result feed (JobStore::ResultsAfter) on a
// thread of its own and hands every result committed from its start on,
// in seq order and exactly once, to `on_result` -- whichever replica
// committed it. WatchResults is served from it (so a watcher of any
// replica sees every replica's results, numbered by their cursor), and a
// replica of a fleet learns from it that a job it runs was cancelled or
// finished elsewhere.
//
// Latency: a local commit calls Wake(), so its result goes out at once;
// another replica's commit is seen within `poll_interval`. A store that
// fails is retried at the next poll (its error is logged once per outage),
// and nothing is skipped: the feed only moves past rows it has delivered.
//
// Thread safety: Wake and last_seq are thread-safe; `on_result` runs on
// the feed's thread only. Start once; Stop joins (idempotent; the
// destructor stops).
#ifndef ATTNAUDIT_SERVER_JOBS_RESULT_FEED_H_
#define ATTNAUDIT_SERVER_JOBS_RESULT_FEED_H_

#include <cstdint>
#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/store/job_store.h"

namespace attnaudit::server {

class ResultFeed {
 public:
  using OnResult = std::function<void(const ResultRecord&)>;
  // After every read of the store: whether it answered.
  using OnHealth = std::function<void(bool store_answered)>;
  struct Options {
    absl::Duration poll_interval = absl::Milliseconds(200);
    int batch = 256;  // rows read per query
  };

  // `store` is not owned and must outlive the feed.
  ResultFeed(JobStore* store, Options options, OnResult on_result,
             OnHealth on_health = nullptr);
  ~ResultFeed();
  ResultFeed(const ResultFeed&) = delete;
  ResultFeed& operator=(const ResultFeed&) = delete;

  // Starts the thread, delivering results with seq > after_seq (the
  // caller read the store's LastSeq: results before it are not replayed).
  void Start(int64_t after_seq);
  void Wake();
  void Stop();
  // The seq of the last result delivered (or skipped at Start).
  int64_t last_seq() const;

 private:
  void Loop();
  // Delivers what the store holds after last_seq_; false on a store error.
  bool DrainOnce();

  JobStore* const store_;
  const Options options_;
  const OnResult on_result_;
  const OnHealth on_health_;
  mutable absl::Mutex mu_;
  int64_t last_seq_ ABSL_GUARDED_BY(mu_) = 0;
  bool woken_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool failing_ = false;  // feed thread only: an outage is being logged
  std::thread thread_;
};

}  // namespace attnaudit::server

#endif  // ATTNAUDIT_SERVER_JOBS_RESULT_FEED_H_
