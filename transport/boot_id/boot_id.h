// The kernel boot id that both ends of the memfd transport compare
// (SnapshotMemfd.boot_id): a client names its memfd by a /proc path, which
// means the same file only to a server on the same running kernel.
//
// Thread-safe; reads /proc on every call.
#ifndef ATTNAUDIT_TRANSPORT_BOOT_ID_BOOT_ID_H_
#define ATTNAUDIT_TRANSPORT_BOOT_ID_BOOT_ID_H_

#include <string>

#include "absl/status/statusor.h"

namespace attnaudit {

// This kernel's boot id: the first line of /proc/sys/kernel/random/boot_id
// without its line end. Internal when it cannot be read or is empty.
absl::StatusOr<std::string> ReadBootId();

}  // namespace attnaudit

#endif  // ATTNAUDIT_TRANSPORT_BOOT_ID_BOOT_ID_H_
