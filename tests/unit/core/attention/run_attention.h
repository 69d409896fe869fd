// Test helper: validate -> PrepareAttention -> ComputeAttention
// for one snapshot, keeping the resolved layout with the results.
// Header-only, test-only; not thread-safe to share a Run while mutating.
#ifndef ATTNAUDIT_TESTS_UNIT_CORE_ATTENTION_RUN_ATTENTION_H_
#define ATTNAUDIT_TESTS_UNIT_CORE_ATTENTION_RUN_ATTENTION_H_

#include <atomic>
#include <utility>

#include "absl/status/statusor.h"
#include "core/attention/attention.h"
#include "core/snapshot/snapshot.h"
#include "core/validate/validate.h"

namespace attnaudit {
namespace testing {

struct AttentionRun {
  ResolvedLayout layout;
  AttentionResults results;
};

inline absl::StatusOr<AttentionRun> RunAttention(
    const Snapshot& snapshot, int threads = 2,
    const std::atomic<bool>* cancelled = nullptr) {
  AttentionRun run;
  absl::StatusOr<ResolvedLayout> layout = ValidateSnapshot(snapshot);
  if (!layout.ok()) return layout.status();
  run.layout = *std::move(layout);
  absl::StatusOr<PreparedAttention> prepared =
      PrepareAttention(snapshot, run.layout, threads);
  if (!prepared.ok()) return prepared.status();
  AttentionRunOptions options;
  options.threads = threads;
  options.cancelled = cancelled;
  absl::StatusOr<AttentionResults> results =
      ComputeAttention(*prepared, options);
  if (!results.ok()) return results.status();
  run.results = *std::move(results);
  return run;
}

}  // namespace testing
}  // namespace attnaudit

#endif  // ATTNAUDIT_TESTS_UNIT_CORE_ATTENTION_RUN_ATTENTION_H_
