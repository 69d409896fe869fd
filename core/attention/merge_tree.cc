#include "core/attention/merge_tree.h"

#include <algorithm>
#include <utility>

#include "core/attention/merge.h"

namespace attnaudit {
namespace merge_tree {

// Buffers: one per level and a spare (index levels_) that holds the node
// being carried; a node changes level by swapping buffer indices, never by
// copying its elements.
void MergeTree::Reset(int64_t d, int64_t max_units) {
  d_ = d;
  next_ = 0;
  levels_ = LevelsFor(max_units);
  const size_t need = static_cast<size_t>(levels_ + 1) * static_cast<size_t>(d);
  if (pool_.size() < need) pool_.resize(need);
  buf_.resize(static_cast<size_t>(levels_) + 1);
  for (int k = 0; k <= levels_; ++k) buf_[k] = k;
  lse_.assign(static_cast<size_t>(levels_), merge_step::F::NegInf());
  has_.assign(static_cast<size_t>(levels_), 0);
}

void MergeTree::JoinLeft(int k, bool* present, float* lse) {
  if (*present) MergeInto(Buffer(k), &lse_[k], Buffer(levels_), *lse, d_);
  *lse = lse_[k];
  *present = true;
  std::swap(buf_[k], buf_[levels_]);
  has_[k] = 0;
}

void MergeTree::CarryFrom(int64_t v, int k, bool present, float lse) {
  for (; (v >> k) & 1; ++k) {
    if (has_[k]) JoinLeft(k, &present, &lse);
  }
  std::swap(buf_[k], buf_[levels_]);
  has_[k] = present ? 1 : 0;
  lse_[k] = lse;
}

void MergeTree::AdvanceTo(int64_t index) {
  for (; next_ < index; ++next_) {
    CarryFrom(next_, 0, false, merge_step::F::NegInf());
  }
}

void MergeTree::Add(int64_t index, const float* out, float lse) {
  AdvanceTo(index);
  ++next_;
  std::copy(out, out + d_, Buffer(levels_));
  CarryFrom(index, 0, !Empty(lse), lse);
}

void MergeTree::Finish(float* out, float* lse) {
  bool present = false;
  float node_lse = merge_step::F::NegInf();
  for (int k = 0; k < levels_; ++k) {
    if (has_[k]) JoinLeft(k, &present, &node_lse);
  }
  if (present) {
    std::copy(Buffer(levels_), Buffer(levels_) + d_, out);
  } else {
    std::fill(out, out + d_, 0.0f);
  }
  *lse = node_lse;
}

}  // namespace merge_tree
}  // namespace attnaudit
