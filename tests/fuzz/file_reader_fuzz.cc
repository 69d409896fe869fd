// Fuzz target: the snapshot file reader (ReadSnapshotFile: the file is
// mapped and every tensor is a view into the mapping) on a file holding the
// input, then validation of what it read. Invariants: errors are
// InvalidArgument and start with the file's path; a snapshot read from the
// file validates or fails InvalidArgument; its views stay readable until
// it is destroyed (sanitizers catch a read past the mapping).
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/strings/match.h"
#include "core/validate/validate.h"
#include "proto/codec/codec.h"
#include "tests/fuzz/fuzz_limits.h"

namespace {

void Require(bool invariant) {
  if (!invariant) std::abort();
}

// One file per process, rewritten for every input (the reader's snapshot
// of the previous input is gone by then).
const std::string& InputPath() {
  static const std::string* path = [] {
    char tmpl[] = "/tmp/attnaudit_file_fuzz_XXXXXX";
    const int fd = mkstemp(tmpl);
    Require(fd >= 0);
    ::close(fd);
    return new std::string(tmpl);
  }();
  return *path;
}

void WriteInput(const uint8_t* data, size_t size) {
  FILE* f = std::fopen(InputPath().c_str(), "wb");
  Require(f != nullptr);
  Require(size == 0 || std::fwrite(data, 1, size, f) == size);
  Require(std::fclose(f) == 0);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace attnaudit;  // NOLINT: a fuzz entry point
  WriteInput(data, size);
  absl::StatusOr<Snapshot> snapshot = ReadSnapshotFile(InputPath());
  if (!snapshot.ok()) {
    Require(snapshot.status().code() == absl::StatusCode::kInvalidArgument);
    Require(absl::StartsWith(snapshot.status().message(), InputPath()));
    return 0;
  }
  absl::StatusOr<ResolvedLayout> layout =
      ValidateSnapshot(*snapshot, testing::FuzzLimits());
  Require(layout.ok() ||
          layout.status().code() == absl::StatusCode::kInvalidArgument);
  // Touch every view while the mapping is alive.
  uint64_t sum = 0;
  for (const Tensor* t :
       {&snapshot->q, &snapshot->k_pages, &snapshot->v_pages}) {
    if (!t->present()) continue;
    for (char c : t->bytes()) sum += static_cast<unsigned char>(c);
  }
  (void)sum;
  return 0;
}
