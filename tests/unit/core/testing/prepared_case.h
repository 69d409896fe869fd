// A logical case laid out in a page pool, validated and prepared for the
// attention pass: what tests of the pass's kernels (CPU and GPU) start
// from. Test-only; not thread-safe.
#ifndef ATTNAUDIT_TESTS_UNIT_CORE_TESTING_PREPARED_CASE_H_
#define ATTNAUDIT_TESTS_UNIT_CORE_TESTING_PREPARED_CASE_H_

#include <memory>

#include "core/attention/attention.h"
#include "core/snapshot/snapshot.h"
#include "core/validate/validate.h"
#include "tests/unit/core/testing/snapshot_builder.h"

namespace attnaudit {
namespace testing {

struct Prepared {
  Snapshot snapshot;
  ResolvedLayout layout;
  PreparedAttention p;
};

// Heap-allocated so the pointers PreparedAttention keeps stay valid.
// Validation and preparation failures are test failures (EXPECT).
std::unique_ptr<Prepared> Prepare(const LogicalCase& c,
                                  const PagingOptions& paging);

}  // namespace testing
}  // namespace attnaudit

#endif  // ATTNAUDIT_TESTS_UNIT_CORE_TESTING_PREPARED_CASE_H_
