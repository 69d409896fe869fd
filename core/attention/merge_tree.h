// The order in which P merges a query's unit states: a balanced binary
// tree over the unit indices (docs/NUMERICS.md, "The merge routine"). For
// a row of U units, the node at level L and index j covers the units
// [j 2^L, (j + 1) 2^L) of [0, U); it is the merge (merge_step.h, the left
// child as the accumulator) of its two children, or its only child when
// the right one covers no unit. The root is P's state before the sinks
// and the final rounding.
//
// A state with lse -inf is empty (a unit the query sees no key of, or
// that no rank computed): a node with an empty child is its other child,
// copied, with no arithmetic -- so absent units need no storage and every
// target agrees on them.
//
// Why a tree: its depth is log2 U, so a GPU merges a long row's units in
// parallel instead of in a chain of U dependent steps, and an fp32
// state's rounding grows with log2 U instead of U.
//
// Two forms of the one order, both walking the units in ascending index
// order with a stack of the pending left subtrees (a node waits at level
// L while bit L of the next index is 1):
//   - ElementTree (host and device): one element of out (or a few
//     adjacent ones) and the lse, for the CUDA kernels and their CPU
//     emulation;
//   - MergeTree (host): whole rows of D floats through MergeInto, for the
//     CPU pass and the CP combines; the CPU pass also carries a unit up
//     its tree as the unit leaves its value tiles (PlanLeaf).
// tests/unit/core/attention/merge_tree_test.cc holds both to a recursive
// reading of the definition, bit for bit. Not thread-safe; one tree per
// query row.
#ifndef ATTNAUDIT_CORE_ATTENTION_MERGE_TREE_H_
#define ATTNAUDIT_CORE_ATTENTION_MERGE_TREE_H_

#include <cstdint>
#include <type_traits>
#include <vector>

#include "core/arithmetic/host_device.h"
#include "core/attention/merge_step.h"

namespace attnaudit {
namespace merge_tree {

ATTNAUDIT_HOST_DEVICE inline bool Empty(float lse) {
  return lse == merge_step::F::NegInf();
}

// Levels a tree of `units` leaves needs: the bit length of units - 1, and
// one for the leaves.
ATTNAUDIT_HOST_DEVICE inline int LevelsFor(int64_t units) {
  int levels = 1;
  while (levels < 63 && (int64_t{1} << (levels - 1)) < units) ++levels;
  return levels;
}

// The tree of kWidth elements of out (adjacent elements of one state,
// which share its lse) of at most 2^(kLevels - 1) leaves. Empty() or
// Reset() starts it; Add the present leaves in ascending index order
// (skipped indices are empty), then Finish. Each merge computes its
// weights once for the kWidth elements; every element gets the bits of a
// one-element tree. kEveryLevel: a leaf walks every level with the level
// as a constant index (a GPU compiler that unrolls it keeps the tree in
// registers, not in local memory), the same merges in the same order.
template <int kLevels, int kWidth = 1, bool kEveryLevel = false>
struct ElementTree {
  float out[kLevels][kWidth];
  float lse[kLevels];
  bool has[kLevels];
  long long next;  // leaves below are in

  ATTNAUDIT_HOST_DEVICE void Reset() {
    if constexpr (kEveryLevel) {
#if defined(ATTNAUDIT_DEVICE_CODE)
#pragma unroll
#endif
      for (int k = 0; k < kLevels; ++k) has[k] = false;
    } else {
      for (int k = 0; k < kLevels; ++k) has[k] = false;
    }
    next = 0;
  }

  // Leaf `index` >= next, its elements o and its lse (empty: ignored).
  ATTNAUDIT_HOST_DEVICE void Add(long long index, const float (&o)[kWidth],
                                 float l) {
    const float none[kWidth] = {};
    while (next < index) Carry(next++, false, none, 0.0f);
    Carry(next++, !Empty(l), o, l);
  }

  // The root into o, *l: out 0 and lse -inf when every leaf was empty.
  ATTNAUDIT_HOST_DEVICE void Finish(float (&o)[kWidth], float* l) const {
    bool nh = false;
    for (int x = 0; x < kWidth; ++x) o[x] = 0.0f;
    float nl = merge_step::F::NegInf();
    if constexpr (kEveryLevel) {
#if defined(ATTNAUDIT_DEVICE_CODE)
#pragma unroll
#endif
      for (int k = 0; k < kLevels; ++k) {
        if (has[k]) JoinLeft(k, &nh, o, &nl);
      }
    } else {
      for (int k = 0; k < kLevels; ++k) {
        if (has[k]) JoinLeft(k, &nh, o, &nl);
      }
    }
    *l = nl;
  }

  // The one-element forms.
  template <int W = kWidth, typename = std::enable_if_t<W == 1>>
  ATTNAUDIT_HOST_DEVICE void Add(long long index, float o, float l) {
    const float one[1] = {o};
    Add(index, one, l);
  }
  template <int W = kWidth, typename = std::enable_if_t<W == 1>>
  ATTNAUDIT_HOST_DEVICE void Finish(float* o, float* l) const {
    float one[1];
    Finish(one, l);
    *o = one[0];
  }

 private:
  // The node (no, *nl, present when *nh) <- merge(pending node k, node):
  // the node k itself when the node is empty.
  ATTNAUDIT_HOST_DEVICE void JoinLeft(int k, bool* nh, float (&no)[kWidth],
                                      float* nl) const {
    if (!*nh) {
      for (int x = 0; x < kWidth; ++x) no[x] = out[k][x];
      *nl = lse[k];
      *nh = true;
      return;
    }
    const merge_step::PairWeights w = merge_step::Weights(lse[k], *nl);
    for (int x = 0; x < kWidth; ++x) {
      no[x] = merge_step::Element(w, out[k][x], no[x]);
    }
    *nl = merge_step::Lse(w);
  }

  // Leaf v (present when nh) up through the levels whose bit of v is 1.
  ATTNAUDIT_HOST_DEVICE void Carry(long long v, bool nh,
                                   const float (&leaf)[kWidth], float nl) {
    float no[kWidth];
    for (int x = 0; x < kWidth; ++x) no[x] = leaf[x];
    if constexpr (kEveryLevel) {
      CarryEveryLevel(v, nh, no, nl);
      return;
    }
    int k = 0;
    for (; (v >> k) & 1; ++k) {
      if (!has[k]) continue;
      JoinLeft(k, &nh, no, &nl);
      has[k] = false;
    }
    has[k] = nh;
    for (int x = 0; x < kWidth; ++x) out[k][x] = no[x];
    lse[k] = nl;
  }

  // Carry's walk over every level: merges at the levels whose bit of v is
  // 1, the node placed at the first whose bit is 0.
  ATTNAUDIT_HOST_DEVICE void CarryEveryLevel(long long v, bool nh,
                                             float (&no)[kWidth], float nl) {
    bool placed = false;
#if defined(ATTNAUDIT_DEVICE_CODE)
#pragma unroll
#endif
    for (int k = 0; k < kLevels; ++k) {
      if (placed) continue;
      if ((v >> k) & 1) {
        if (has[k]) {
          JoinLeft(k, &nh, no, &nl);
          has[k] = false;
        }
        continue;
      }
      has[k] = nh;
      for (int x = 0; x < kWidth; ++x) out[k][x] = no[x];
      lse[k] = nl;
      placed = true;
    }
  }
};

// A query row's tree of D-float states. Storage is reused across Reset.
class MergeTree {
 public:
  // Empty, for rows of `d` elements and up to `max_units` leaves.
  void Reset(int64_t d, int64_t max_units);

  // Leaf `index` (ascending across calls, below Reset's max_units) with
  // state (out, lse); an empty lse adds nothing.
  void Add(int64_t index, const float* out, float lse);

  // The fused form of Add, for a leaf whose elements are produced later:
  // PlanLeaf(index, ...) returns how many pending left nodes the leaf
  // merges with on its way up, lowest first -- lefts[s] with lse
  // left_lse[s]: the caller turns the leaf's elements x into
  // merge_step::Element(Weights(left_lse[s], lse so far), lefts[s], x) in
  // turn -- and where the result goes (*dest, not one of the lefts).
  // Commit(index, lse) then records it with the lse those merges gave
  // (the leaf's own when none). The leaf must not be empty; lefts and
  // left_lse hold Levels() entries.
  int PlanLeaf(int64_t index, const float** lefts, float* left_lse,
               float** dest) {
    if (next_ < index) AdvanceTo(index);
    int n = 0;
    int k = 0;
    for (; (index >> k) & 1; ++k) {
      if (!has_[k]) continue;
      lefts[n] = Buffer(k);
      left_lse[n] = lse_[k];
      ++n;
    }
    *dest = Buffer(k);  // level k is free: bit k of index is 0
    return n;
  }
  void Commit(int64_t index, float lse) {
    ++next_;
    int k = 0;
    for (; (index >> k) & 1; ++k) has_[k] = 0;
    has_[k] = 1;
    lse_[k] = lse;
  }
  int Levels() const { return levels_; }

  // The root into out[0, d) and *lse (out 0, lse -inf when every leaf was
  // empty).
  void Finish(float* out, float* lse);

 private:
  float* Buffer(int k) { return &pool_[static_cast<size_t>(buf_[k]) * d_]; }
  // The carried node (the spare buffer; present when *present, lse *lse)
  // <- merge(pending node k, it), or node k itself when it is empty;
  // level k is no longer pending.
  void JoinLeft(int k, bool* present, float* lse);
  // Completes leaves [next_, index) as empty ones.
  void AdvanceTo(int64_t index);
  // The node of leaf v at level k sits in the spare buffer (present when
  // `present`, lse `lse`); carries it up through v's 1 bits from k and
  // leaves it pending.
  void CarryFrom(int64_t v, int k, bool present, float lse);

  int64_t d_ = 0;
  int64_t next_ = 0;
  int levels_ = 0;
  std::vector<float> pool_;   // levels_ + 1 buffers of d_ floats
  std::vector<int> buf_;      // [level] its buffer; [levels_]: the spare
  std::vector<float> lse_;    // [level]
  std::vector<uint8_t> has_;  // [level] a pending, present node
};

}  // namespace merge_tree
}  // namespace attnaudit

#endif  // ATTNAUDIT_CORE_ATTENTION_MERGE_TREE_H_
