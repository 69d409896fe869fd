// Fuzz target: the bytes of a snapshot (a binary attnaudit.v1.Snapshot, as
// a client sends it and a snapshot file holds it) through parsing, the
// wire check that explains parse failures, decoding, validation and, when
// valid, a tiny audit and the report's encodings. Any abort, sanitizer
// report or leak is a bug; the checks below are invariants:
//   - protobuf refuses the bytes  => DescribeParseFailure is InvalidArgument;
//   - protobuf accepts them       => the wire check finds nothing;
//   - decoding fails only with InvalidArgument;
//   - RunAudit never fails for bad input (an INVALID verdict instead);
//   - a report survives ReportToProto -> ReportFromProto.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "absl/strings/string_view.h"
#include "attnaudit/v1/snapshot.pb.h"
#include "core/audit/audit.h"
#include "proto/codec/codec.h"
#include "proto/codec/wire_check.h"
#include "tests/fuzz/fuzz_limits.h"

namespace {

void Require(bool invariant) {
  if (!invariant) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace attnaudit;  // NOLINT: a fuzz entry point
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  v1::Snapshot msg;
  if (!msg.ParseFromArray(data, static_cast<int>(size))) {
    const absl::Status why =
        DescribeParseFailure(*v1::Snapshot::descriptor(), bytes, "snapshot");
    Require(why.code() == absl::StatusCode::kInvalidArgument);
    return 0;
  }
  Require(CheckWireFormat(*v1::Snapshot::descriptor(), bytes).ok());
  absl::StatusOr<Snapshot> snapshot = SnapshotFromProto(&msg);
  if (!snapshot.ok()) {
    Require(snapshot.status().code() == absl::StatusCode::kInvalidArgument);
    return 0;
  }
  AuditOptions options;
  options.threads = 1;
  options.limits = testing::FuzzLimits();
  options.compute_kv_fingerprint = true;
  absl::StatusOr<AuditReport> report = RunAudit(*snapshot, options);
  Require(report.ok());
  v1::AuditReport encoded;
  ReportToProto(*report, &encoded);
  Require(ReportFromProto(encoded).ok());
  ReportToJson(*report, /*pretty=*/false).IgnoreError();
  return 0;
}
