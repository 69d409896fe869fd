// Assertions shared by the core/validate tests.
#ifndef ATTNAUDIT_TESTS_UNIT_CORE_VALIDATE_VALIDATE_TEST_UTIL_H_
#define ATTNAUDIT_TESTS_UNIT_CORE_VALIDATE_VALIDATE_TEST_UTIL_H_

#include <functional>
#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "core/validate/validate.h"
#include "gtest/gtest.h"
#include "tests/unit/core/testing/snapshot_builder.h"

namespace attnaudit {
namespace testing {

// Validation fails with InvalidArgument, the message starts with `path`
// and contains `contains` (when not empty).
inline ::testing::AssertionResult IsInvalid(
    const absl::StatusOr<ResolvedLayout>& result, const std::string& path,
    const std::string& contains = "") {
  if (result.ok()) {
    return ::testing::AssertionFailure() << "validation passed; expected an "
                                            "error starting with "
                                         << path;
  }
  const absl::Status& st = result.status();
  if (st.code() != absl::StatusCode::kInvalidArgument) {
    return ::testing::AssertionFailure()
           << "code " << absl::StatusCodeToString(st.code()) << ": "
           << st.message();
  }
  // `path` is the whole field path ("q[0][1]") or its prefix up to an
  // index the test cannot know statically ("slot_positions" for
  // "slot_positions[3][1]").
  const absl::string_view message = st.message();
  if (!absl::StartsWith(message, path) || message.size() <= path.size() ||
      (message[path.size()] != ':' && message[path.size()] != '[')) {
    return ::testing::AssertionFailure()
           << "message does not start with the field path '" << path
           << "': " << st.message();
  }
  if (!contains.empty() && !absl::StrContains(st.message(), contains)) {
    return ::testing::AssertionFailure()
           << "message lacks '" << contains << "': " << st.message();
  }
  return ::testing::AssertionSuccess() << st.message();
}

inline ::testing::AssertionResult IsValid(
    const absl::StatusOr<ResolvedLayout>& result) {
  if (result.ok()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << result.status().message();
}

// One table-driven invalid case: start from BuildSnapshot(spec), apply
// `mutate` (it may also tighten the limits), expect an InvalidArgument whose
// message starts with `path` and contains `contains`.
struct InvalidCase {
  std::string name;  // gtest parameter name: [A-Za-z0-9_]
  std::function<void(Snapshot*, ValidationLimits*)> mutate;
  std::string path;
  std::string contains;
  SnapshotSpec spec = {};
};

inline std::ostream& operator<<(std::ostream& os, const InvalidCase& c) {
  return os << c.name;
}

inline std::string CaseName(const ::testing::TestParamInfo<InvalidCase>& info) {
  return info.param.name;
}

// Runs one InvalidCase (after checking the unmutated snapshot is valid, so
// the case really tests its own rule).
inline void RunInvalidCase(const InvalidCase& c) {
  Snapshot s = BuildSnapshot(c.spec);
  ValidationLimits limits;
  ASSERT_TRUE(IsValid(ValidateSnapshot(s, limits))) << "baseline of " << c.name;
  c.mutate(&s, &limits);
  EXPECT_TRUE(IsInvalid(ValidateSnapshot(s, limits), c.path, c.contains));
}

}  // namespace testing
}  // namespace attnaudit

#endif  // ATTNAUDIT_TESTS_UNIT_CORE_VALIDATE_VALIDATE_TEST_UTIL_H_
