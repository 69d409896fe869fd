// Label values as they may reach metrics, logs, the store and reports.
// Labels come from clients (Snapshot.labels) and are otherwise unbounded:
// one request with a 1 MiB model name would put 1 MiB into every metric
// series, log line and stored row that carries it. The RPC layer bounds
// them where a request is decoded, so nothing behind it sees raw values:
//
//   - characters outside [A-Za-z0-9 ._:/@+=#~-] become '_' (no quotes,
//     backslashes, control characters or non-ASCII bytes, which would need
//     escaping in the text exposition format and in key=value logs);
//   - a value longer than kMaxLabelBytes keeps its first
//     kMaxLabelBytes - kTruncationMarker.size() bytes and ends in
//     kTruncationMarker, so the report a client gets back shows that its
//     value was cut.
//
// server/metrics bounds the number of distinct model/layer values on top
// (the first few, then "other"). Thread safety: pure functions.
#ifndef ATTNAUDIT_SERVER_JOBS_LABEL_BOUNDS_H_
#define ATTNAUDIT_SERVER_JOBS_LABEL_BOUNDS_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "core/snapshot/snapshot.h"

namespace attnaudit::server {

inline constexpr size_t kMaxLabelBytes = 64;
inline constexpr absl::string_view kTruncationMarker = "~truncated";

// Bounds one value in place; true when it was truncated.
bool BoundLabelValue(std::string* value);

// Which values BoundLabels truncated.
struct LabelTruncations {
  bool model = false;
  bool engine = false;
  bool backend = false;
  bool run = false;
  bool weight_version = false;
  int64_t request_ids = 0;  // how many of them
  int64_t total() const {
    return int64_t{model} + int64_t{engine} + int64_t{backend} + int64_t{run} +
           int64_t{weight_version} + request_ids;
  }
};

// Bounds model, engine, backend, run, weight_version and every request id.
LabelTruncations BoundLabels(Labels* labels);

}  // namespace attnaudit::server

#endif  // ATTNAUDIT_SERVER_JOBS_LABEL_BOUNDS_H_
