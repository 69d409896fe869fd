// The codec: the one mapping between the wire contract (attnaudit.v1
// protobuf messages, proto/attnaudit/v1/*.proto) and the core types
// (core/snapshot, core/report, core/audit), plus snapshot files and report
// JSON.
//
// Ownership. Tensor bytes are large (hundreds of MiB), so the *FromProto /
// moving *ToProto functions take them by swapping std::string buffers: the
// source message's (or Snapshot's) `data` fields are left empty and the
// destination owns the very same heap buffers. Nothing else is shared; all
// outputs are independent values. Messages may live on an arena.
//
// Enums. The wire enums have an *_UNSPECIFIED = 0 value that maps onto the
// core default documented in the .proto; a value the contract does not know
// (a newer client, a corrupt message) is InvalidArgument naming the field,
// e.g. "rope.style: unknown value 7". Scalars at their proto3 zero value map
// onto the core defaults documented on each field, so a decoded message
// round-trips through the core exactly when it was produced by the encoder.
//
// Errors are InvalidArgument with the field path (relative to the message
// passed in) at the start of the message. The codec checks only what it needs
// to build core values (known enums, tensor dtypes, shape rank); shapes and
// sizes are ValidateSnapshot's job (core/validate).
//
// Thread safety: all functions are reentrant; they touch only their
// arguments.
#ifndef ATTNAUDIT_PROTO_CODEC_CODEC_H_
#define ATTNAUDIT_PROTO_CODEC_CODEC_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "attnaudit/v1/report.pb.h"
#include "attnaudit/v1/service.pb.h"
#include "attnaudit/v1/snapshot.pb.h"
#include "attnaudit/v1/tensor.pb.h"
#include "core/audit/options.h"
#include "core/pairs/pairs.h"
#include "core/report/report.h"
#include "core/snapshot/snapshot.h"
#include "core/tensor/tensor.h"

namespace attnaudit {

// Largest tensor rank the codec accepts (the contract's largest is 5).
inline constexpr int kMaxTensorRank = 8;

// ---- Tensors ---------------------------------------------------------------

// Moves msg->data() into the returned Tensor (msg->data() is left empty).
// A message with DTYPE_UNSPECIFIED, no shape and no data decodes to an absent
// Tensor; DTYPE_UNSPECIFIED with a shape or data, an unknown dtype, or a rank
// above kMaxTensorRank is InvalidArgument naming `field`.
absl::StatusOr<Tensor> TensorFromProto(v1::Tensor* msg,
                                       absl::string_view field);

// Copies (const&) or moves (&&, leaving tensor's bytes empty) a present
// tensor into *msg. Callers skip absent tensors (see the Snapshot encoders).
void TensorToProto(const Tensor& tensor, v1::Tensor* msg);
void TensorToProto(Tensor&& tensor, v1::Tensor* msg);

// ---- Snapshots -------------------------------------------------------------

// Decodes a snapshot, moving every tensor's bytes out of *msg (zero copy).
// On error *msg may have been partly emptied.
absl::StatusOr<Snapshot> SnapshotFromProto(v1::Snapshot* msg);

// Encodes a snapshot. Absent tensors are left unset; enums are written
// explicitly (never *_UNSPECIFIED). The const& form copies the bytes; the
// && form moves them, leaving `snapshot`'s tensors with empty bytes.
void SnapshotToProto(const Snapshot& snapshot, v1::Snapshot* msg);
void SnapshotToProto(Snapshot&& snapshot, v1::Snapshot* msg);

// ---- Audit options ---------------------------------------------------------

// Overwrites the fields of *options that the wire carries (comparisons,
// tolerances, cp_strategy, include_merge_orders, compute_kv_fingerprint,
// worst_heads) and leaves the server-side ones (threads, limits, cancelled,
// on_stage) as they are. Empty `comparisons` means all three.
absl::Status AuditOptionsFromProto(const v1::AuditOptions& msg,
                                   AuditOptions* options);
// The same, starting from default AuditOptions.
absl::StatusOr<AuditOptions> AuditOptionsFromProto(const v1::AuditOptions& msg);
// Encodes the wire-carried fields; the comparisons are listed explicitly.
void AuditOptionsToProto(const AuditOptions& options, v1::AuditOptions* msg);

// ---- Reports ---------------------------------------------------------------

void ReportToProto(const AuditReport& report, v1::AuditReport* msg);
absl::StatusOr<AuditReport> ReportFromProto(const v1::AuditReport& msg);

// A train-rollout pair report (core/pairs). Encoding only: a stored pair's
// report is read by clients, never by the server.
void PairReportToProto(const PairReport& report, v1::PairReport* msg);
v1::PairVerdict EncodePairVerdict(PairVerdict verdict);

// The report as proto3 JSON (proto field names, e.g. "max_abs"; enums by
// name, e.g. "VERDICT_PASS"; zero-valued scalars printed; int64 as strings,
// per the proto3 JSON mapping). `pretty` adds newlines and indentation.
// Fails only on strings that are not valid UTF-8 (e.g. in labels).
absl::StatusOr<std::string> ReportToJson(const AuditReport& report,
                                         bool pretty = true);

// ---- Capabilities ----------------------------------------------------------

// Fills the validation fields of *msg (max_tensor_bytes through max_vocab)
// from `limits`; the server fills the transport and queue fields.
void ValidationLimitsToProto(const ValidationLimits& limits, v1::Limits* msg);

// ---- Snapshot files --------------------------------------------------------

// A snapshot file is the binary protobuf encoding of one attnaudit.v1.Snapshot
// (nothing else: no header, no framing), usually named *.pb.

// Largest snapshot file: protobuf messages are limited to 2 GiB - 1.
inline constexpr int64_t kMaxSnapshotFileBytes = (int64_t{1} << 31) - 1;

// Reads and decodes a snapshot file without copying its tensor bytes: the
// file is mapped read-only and every tensor of the returned Snapshot is a
// view into the mapping (Tensor::is_view), which stays mapped as long as
// any of them lives. A tensor whose bytes do not start at a multiple of its
// element size in the file (the protobuf encoding puts them anywhere) is
// copied instead, so that every tensor is naturally aligned. The file must not
// be truncated or rewritten in place meanwhile (WriteSnapshotFile replaces
// files by rename, which is safe). Errors start with the path:
//   NotFound / PermissionDenied ...   "<path>: cannot open: <reason>"
//   InvalidArgument                   "<path>: empty file, not an
//                                      attnaudit.v1.Snapshot"
//   InvalidArgument                   "<path>: not a valid
//   attnaudit.v1.Snapshot
//                                      (truncated or corrupt protobuf)"
//   InvalidArgument                   "<path>: <size> bytes is over the 2 GiB
//                                      limit of a snapshot file ..."
//   InvalidArgument                   "<path>: <field>: ..."
//   (SnapshotFromProto)
// A file cut exactly at a field boundary parses as a shorter message; that
// is caught by validation (a missing tensor), not here.
absl::StatusOr<Snapshot> ReadSnapshotFile(const std::string& path);

// The snapshot encoded in `file` (a snapshot file's bytes, e.g. mapped),
// its tensors viewing their payloads in place; `owner` keeps the bytes
// alive as long as any tensor views them. A payload at an offset its
// dtype cannot be read from (misaligned) is copied. InvalidArgument: "not
// a valid attnaudit.v1.Snapshot (truncated or corrupt protobuf)", or
// "<field>: ..." (SnapshotFromProto).
absl::StatusOr<Snapshot> DecodeMappedSnapshot(
    absl::string_view file, const std::shared_ptr<const void>& owner);

// Writes the snapshot atomically: to a temporary file in the same directory,
// fsync, rename over `path`, fsync the directory. On any error `path` is
// untouched and the temporary file is removed. InvalidArgument when the
// encoding would exceed kMaxSnapshotFileBytes.
absl::Status WriteSnapshotFile(const std::string& path,
                               const Snapshot& snapshot);

}  // namespace attnaudit

#endif  // ATTNAUDIT_PROTO_CODEC_CODEC_H_
