// Test fixtures for the codec: a snapshot and a report with every field set
// to a non-default value, and field-by-field equality checks written out by
// hand (independent of the codec's own field tables).
#ifndef ATTNAUDIT_TESTS_UNIT_PROTO_CODEC_TEST_UTIL_H_
#define ATTNAUDIT_TESTS_UNIT_PROTO_CODEC_TEST_UTIL_H_

#include "core/report/report.h"
#include "core/snapshot/snapshot.h"

namespace attnaudit {
namespace testing {

// Dims: B 2, Sq 2, Hq 4, Hkv 2, D 8, N 3 pages of P 4, M 2, W 2 ranks,
// V 5 vocab rows. Tensor contents are pseudo-random bytes (distinct per
// tensor, seeded by `seed`); they need not form a valid snapshot.
Snapshot FullSnapshot(uint32_t seed = 1);

// Every field non-default; three comparisons with ragged merge orders.
AuditReport FullReport();

// gtest EXPECT_* on every field; `where` prefixes failure messages.
void ExpectTensorEq(const Tensor& a, const Tensor& b, const char* where);
void ExpectSnapshotEq(const Snapshot& a, const Snapshot& b);
void ExpectReportEq(const AuditReport& a, const AuditReport& b);

}  // namespace testing
}  // namespace attnaudit

#endif  // ATTNAUDIT_TESTS_UNIT_PROTO_CODEC_TEST_UTIL_H_
