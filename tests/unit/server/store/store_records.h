// Test helpers of the store tests: job rows as the RPC layer writes them.
#ifndef ATTNAUDIT_TESTS_UNIT_SERVER_STORE_STORE_RECORDS_H_
#define ATTNAUDIT_TESTS_UNIT_SERVER_STORE_STORE_RECORDS_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "server/store/job_store.h"

namespace attnaudit::server::store_testing {

inline const absl::Time kT0 = absl::FromUnixSeconds(1700000000);

// A QUEUED row of replica-a with every label set.
inline ResultRecord Queued(const std::string& id, absl::Time created) {
  ResultRecord r;
  r.job_id = id;
  r.created = created;
  r.model = "m";
  r.layer = 3;
  r.engine = "vllm";
  r.backend = "flashinfer";
  r.step = 7;
  r.run = "run-a";
  r.replica = "replica-a";
  return r;
}

// The same job DONE at `finished` with `verdict` and `report`.
inline ResultRecord Done(const std::string& id, int verdict,
                         absl::Time finished, std::string report = "") {
  ResultRecord r = Queued(id, finished - absl::Seconds(1));
  r.state = JobState::kDone;
  r.verdict = verdict;
  r.finished = finished;
  r.report = std::move(report);
  return r;
}

inline std::vector<std::string> Ids(const std::vector<ResultRecord>& rows) {
  std::vector<std::string> out;
  for (const auto& r : rows) out.push_back(r.job_id);
  return out;
}

}  // namespace attnaudit::server::store_testing

#endif  // ATTNAUDIT_TESTS_UNIT_SERVER_STORE_STORE_RECORDS_H_
