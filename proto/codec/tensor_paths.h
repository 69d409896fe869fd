// The Tensor fields of a snapshot, named by path: proto field names joined
// by "." ("q", "k_pages", "cp.rank_out", "engine.lse", ...). The same paths
// name the core Snapshot's members, appear at the start of validation
// errors, and are what AuditStreamHeader.manifest lists (service.proto), so
// a server can assemble streamed bytes straight into the right message
// field and a client can decide what to stream.
//
// The table is static and immutable; all functions are thread-safe.
#ifndef ATTNAUDIT_PROTO_CODEC_TENSOR_PATHS_H_
#define ATTNAUDIT_PROTO_CODEC_TENSOR_PATHS_H_

#include <vector>

#include "absl/strings/string_view.h"
#include "attnaudit/v1/snapshot.pb.h"
#include "core/snapshot/snapshot.h"

namespace attnaudit {

// Every tensor path, in Snapshot field-number order (27 entries).
const std::vector<absl::string_view>& SnapshotTensorPaths();

// The message's tensor at `path`; nullptr when the path is unknown or the
// field (or a parent message) is not set.
const v1::Tensor* FindSnapshotTensor(const v1::Snapshot& msg,
                                     absl::string_view path);
// The message's tensor at `path`, creating it (and its parent) when unset;
// nullptr only when the path is unknown.
v1::Tensor* MutableSnapshotTensor(v1::Snapshot* msg, absl::string_view path);

// The core snapshot's member at `path`; nullptr when the path is unknown.
const Tensor* FindSnapshotTensor(const Snapshot& snapshot,
                                 absl::string_view path);
Tensor* MutableSnapshotTensor(Snapshot* snapshot, absl::string_view path);

}  // namespace attnaudit

#endif  // ATTNAUDIT_PROTO_CODEC_TENSOR_PATHS_H_
