// Drift findings in the engine's terms, shared by the report printer
// (`check`, `audit`, `get`) and `watch`: which comparison and which quantity
// fired, by how much it passed its tolerance, and where, as an engine
// indexes its tensors: the batch row (the block_table row), the query, the
// query head and the KV head it reads, the dim; and the logical block and
// engine page id once something has localised them.
//
// What the report knows today: DriftStats carries the argmax |diff| as
// (b, s, h, d). The value at one (b, s, h, d) mixes every logical block of
// the row, so the statistics cannot name a block or page; a diagnosis (leave
// one block out, page localisation) will, and EngineLocation has the fields
// for it. Pure functions; no state.
#ifndef ATTNAUDIT_CLIENT_CLI_FINDINGS_H_
#define ATTNAUDIT_CLIENT_CLI_FINDINGS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "core/report/report.h"

namespace attnaudit::client {

// A position in the engine's terms; -1 where not known or not applicable.
struct EngineLocation {
  int64_t row = -1;    // batch row: the block_table / kv_seq_lens row
  int64_t query = -1;  // query of the row (decode: 0)
  int64_t head = -1;   // query head
  int64_t kv_head = -1;
  int64_t dim = -1;
  // Not in DriftStats: filled by a diagnosis that localises the drift.
  int64_t logical_block = -1;
  int64_t page_id = -1;
};

// `l` (from DriftStats) with the KV head derived from the GQA group of
// `dims` (head / (Hq / Hkv)).
EngineLocation ToEngineLocation(const Location& l, const SnapshotDims& dims);
// "row 0, query 0, head 18 (kv head 4), dim 7[, logical block 2, page 95]".
std::string FormatEngineLocation(const EngineLocation& l);

// What the two sides of a comparison are called: engine / reference,
// replay / reference, engine / replay.
absl::string_view CandidateName(Comparison c);
absl::string_view BaselineName(Comparison c);

// One quantity of one comparison.
struct Finding {
  Comparison comparison = Comparison::kEngineVsReference;
  Quantity quantity = Quantity::kOut;
  const DriftStats* stats = nullptr;  // points into the report
  // Over its tolerance or NaN/Inf on one side only: what makes a DRIFT.
  bool fired() const;
};

// Every quantity every comparison of `r` has, in report order (E-R, P-R,
// E-P; out, lse, logprob). The findings point into `r`.
std::vector<Finding> FindingsOf(const AuditReport& r);

// A finding for the report, one or two lines, each ending in "\n" and
// starting with `indent`. Fired:
//   lse: 64 of 64 values over the tolerance 4.1e-05, the largest 6.2e+00
//     at row 1, query 0, head 12 (kv head 3): engine 20.36, reference 14.11
// Not fired: "out: within the tolerance 2.7e-02, the largest 7.7e-03 at ...".
std::string DescribeFinding(const Finding& f, const SnapshotDims& dims,
                            absl::string_view indent);

// The reason a result is what it is, in one line (no newline), for `watch`:
//   DRIFT    the first finding that fired (E-R first), e.g. "E-R lse: 64 of
//            64 over the tolerance 4.1e-05, the largest 6.2e+00 at row 1,
//            query 0, head 12 (kv head 3); also fired: E-P lse"
//   PASS     the E-R output margin: "E-R out: the largest 7.7e-03 within the
//            tolerance 5.3e-02"
//   INVALID  "invalid: " and the validation error.
std::string ReasonLine(const AuditReport& r);

}  // namespace attnaudit::client

#endif  // ATTNAUDIT_CLIENT_CLI_FINDINGS_H_
