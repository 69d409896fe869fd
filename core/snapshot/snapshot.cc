#include "core/snapshot/snapshot.h"

#include <cmath>

namespace attnaudit {

SnapshotDims DimsOf(const Snapshot& s) {
  SnapshotDims d;
  if (s.q.rank() == 4) {
    d.batch = s.q.dim(0);
    d.queries = s.q.dim(1);
    d.q_heads = s.q.dim(2);
    d.head_dim = s.q.dim(3);
  }
  if (s.k_pages.rank() == 4) {
    d.num_pages = s.k_pages.dim(0);
    if (s.kv_layout == KvLayout::kNHD) {
      d.page_size = s.k_pages.dim(1);
      d.kv_heads = s.k_pages.dim(2);
    } else {
      d.kv_heads = s.k_pages.dim(1);
      d.page_size = s.k_pages.dim(2);
    }
  }
  if (s.block_table.rank() == 2) d.max_blocks = s.block_table.dim(1);
  return d;
}

double EffectiveScale(const Snapshot& s) {
  if (s.softmax_scale > 0.0) return s.softmax_scale;
  const SnapshotDims d = DimsOf(s);
  return d.head_dim > 0 ? 1.0 / std::sqrt(static_cast<double>(d.head_dim))
                        : 1.0;
}

DType EffectiveOutputDType(const Snapshot& s) {
  if (s.output_dtype != DType::kInvalid) return s.output_dtype;
  if (s.engine.out.present()) return s.engine.out.dtype();
  return s.q.dtype();
}

int64_t EffectiveRotaryDim(const Snapshot& s) {
  return s.rope.rotary_dim > 0 ? s.rope.rotary_dim : DimsOf(s).head_dim;
}

}  // namespace attnaudit
