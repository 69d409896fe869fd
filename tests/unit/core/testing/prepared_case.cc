#include "tests/unit/core/testing/prepared_case.h"

#include <utility>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"

namespace attnaudit {
namespace testing {

std::unique_ptr<Prepared> Prepare(const LogicalCase& c,
                                  const PagingOptions& paging) {
  auto out = std::make_unique<Prepared>();
  out->snapshot = BuildSnapshot(c, paging);
  absl::StatusOr<ResolvedLayout> layout = ValidateSnapshot(out->snapshot);
  EXPECT_TRUE(layout.ok()) << layout.status();
  if (layout.ok()) out->layout = *layout;
  absl::StatusOr<PreparedAttention> p =
      PrepareAttention(out->snapshot, out->layout, 2);
  EXPECT_TRUE(p.ok()) << p.status();
  if (p.ok()) out->p = *std::move(p);
  return out;
}

}  // namespace testing
}  // namespace attnaudit
