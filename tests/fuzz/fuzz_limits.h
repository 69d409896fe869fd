// Validation limits for the fuzz targets: small enough that every input the
// validator accepts audits in milliseconds, large enough that the seed
// snapshots (tests/fuzz/corpus) pass and reach the audit.
#ifndef ATTNAUDIT_TESTS_FUZZ_FUZZ_LIMITS_H_
#define ATTNAUDIT_TESTS_FUZZ_FUZZ_LIMITS_H_

#include "core/validate/validate.h"

namespace attnaudit::testing {

inline ValidationLimits FuzzLimits() {
  ValidationLimits l;
  l.max_tensor_bytes = int64_t{2} << 20;
  l.max_total_bytes = int64_t{4} << 20;
  l.max_batch = 4;
  l.max_queries = 4;
  l.max_heads = 64;
  l.max_head_dim = 256;
  l.max_page_size = 64;
  l.max_blocks = 64;
  l.max_context = 256;
  l.max_cp_world_size = 8;
  l.max_vocab = 64;
  return l;
}

// Stream limit of the assembler target (bytes of one streamed snapshot).
inline constexpr int64_t kFuzzStreamBytes = int64_t{4} << 20;

}  // namespace attnaudit::testing

#endif  // ATTNAUDIT_TESTS_FUZZ_FUZZ_LIMITS_H_
