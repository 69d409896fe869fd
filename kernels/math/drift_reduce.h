// The shape of the GPU drift reduction (kernels/drift_device.inc), host and
// device functions the kernels call (the CPU tests run that source under
// their SIMT emulator: tests/unit/kernels/host_drift.h):
//
//  1. Each of `threads` threads walks the elements i = thread, thread +
//     threads, ... (a grid-stride loop: a warp reads consecutive elements)
//     into its DriftTotals with AddDriftElement, writing every element's
//     p99 key.
//  2. A block's 256 partials combine in a fixed tree (CombineTree); the
//     last block to finish combines the block partials, thread t taking
//     the consecutive blocks [t * per, (t + 1) * per) in order, then the
//     same tree.
//  3. The exact p99 is the k-th smallest key, k = ceil(0.99 count), found
//     by a radix select over the keys kDigitBits at a time, most significant
//     first (DigitOf, SelectDigit).
//
// Counts, maxima, the worst element (the smallest index among equal
// maxima), the first mismatch and the p99 do not depend on the order, so
// they are the CPU's (core/drift/drift.h) exactly; the sums are reduced in
// this fixed tree, the same on every run and every GPU, not in element
// order. Pure functions; thread-safe.
#ifndef ATTNAUDIT_KERNELS_MATH_DRIFT_REDUCE_H_
#define ATTNAUDIT_KERNELS_MATH_DRIFT_REDUCE_H_

#include <cstdint>

#include "core/arithmetic/host_device.h"
#include "kernels/math/drift_element.h"
#include "kernels/math/scalar.h"

namespace attnaudit {
namespace kmath {

// The statistics of a set of elements (DriftStats without the decoded
// locations). Plain data: the device returns it as is.
struct DriftTotals {
  double sum_abs = 0;
  double sum_sq = 0;
  double sum_ulp = 0;
  double max_abs = 0;
  double max_rel = 0;
  double max_ulp = 0;
  long long count = 0;
  long long over = 0;
  long long candidate_nan = 0;
  long long candidate_inf = 0;
  long long baseline_nan = 0;
  long long baseline_inf = 0;
  long long mismatch = 0;
  long long worst = -1;           // flat index, -1: none
  long long first_mismatch = -1;  // flat index, -1: none
  double p99_abs = 0;
};

struct DriftInput {
  const double* candidate = nullptr;  // n values
  const double* baseline = nullptr;
  const uint8_t* mask = nullptr;  // n / inner groups; may be null
  long long n = 0;
  long long inner = 1;  // elements per mask group
  double tolerance = 0;
  int ulp_dtype = 1;  // core DType number
};

constexpr int kDriftThreads = 256;  // threads per block
constexpr int kDriftMaxBlocks = 1024;
// The key of an element outside the p99's population.
constexpr unsigned long long kNotCounted = ~0ull;
constexpr int kDigitBits = 11;
constexpr int kDigitBins = 1 << kDigitBits;
// 64 key bits, most significant first: five passes of 11, one of 9.
constexpr int kSelectPasses = (64 + kDigitBits - 1) / kDigitBits;

// Blocks of a reduction of n elements: a function of n alone, so the sums'
// tree, and their bits, are the same on every GPU.
ATTNAUDIT_HOST_DEVICE inline int DriftBlocks(long long n) {
  const long long b = (n + kDriftThreads - 1) / kDriftThreads;
  return static_cast<int>(b < 1 ? 1
                                : (b > kDriftMaxBlocks ? kDriftMaxBlocks : b));
}

// a <- a combined with b, b holding later elements than a or, for the
// order-free fields, any elements.
ATTNAUDIT_HOST_DEVICE inline void CombineTotals(DriftTotals* a,
                                                const DriftTotals& b) {
  a->sum_abs += b.sum_abs;
  a->sum_sq += b.sum_sq;
  a->sum_ulp += b.sum_ulp;
  if (b.worst >= 0 && (a->worst < 0 || b.max_abs > a->max_abs ||
                       (b.max_abs == a->max_abs && b.worst < a->worst))) {
    a->max_abs = b.max_abs;
    a->worst = b.worst;
  }
  a->max_rel = a->max_rel < b.max_rel ? b.max_rel : a->max_rel;
  a->max_ulp = a->max_ulp < b.max_ulp ? b.max_ulp : a->max_ulp;
  a->count += b.count;
  a->over += b.over;
  a->candidate_nan += b.candidate_nan;
  a->candidate_inf += b.candidate_inf;
  a->baseline_nan += b.baseline_nan;
  a->baseline_inf += b.baseline_inf;
  a->mismatch += b.mismatch;
  if (b.first_mismatch >= 0 &&
      (a->first_mismatch < 0 || b.first_mismatch < a->first_mismatch)) {
    a->first_mismatch = b.first_mismatch;
  }
}

// Element i into t (elements must come in ascending order per t); returns
// its p99 key: the |diff| bit pattern of a counted element (positive
// doubles order as their bits do), kNotCounted otherwise.
ATTNAUDIT_HOST_DEVICE inline unsigned long long AddDriftElement(
    const DriftInput& in, long long i, double tiny, DriftTotals* t) {
  if (in.mask != nullptr && in.mask[i / in.inner] == 0) return kNotCounted;
  const double c = in.candidate[i];
  const double r = in.baseline[i];
  if (IsNan(c) || IsInf(c) || IsNan(r) || IsInf(r)) {
    t->candidate_nan += IsNan(c);
    t->candidate_inf += IsInf(c);
    t->baseline_nan += IsNan(r);
    t->baseline_inf += IsInf(r);
  }
  double ad = 0;
  const int kind = ClassifyPair(c, r, &ad);
  if (kind == kPairMismatch) {
    ++t->mismatch;
    if (t->first_mismatch < 0) t->first_mismatch = i;
    return kNotCounted;
  }
  if (kind != kPairValue) return kNotCounted;
  ++t->count;
  t->sum_abs += ad;
  t->sum_sq += ad * ad;
  if (t->worst < 0 || ad > t->max_abs) {
    t->max_abs = ad;
    t->worst = i;
  }
  t->over += ad > in.tolerance;
  if (ad > 0) {
    const double rel = ad / (Abs(r) > tiny ? Abs(r) : tiny);
    t->max_rel = t->max_rel < rel ? rel : t->max_rel;
    const double u = UlpIn(c, r, in.ulp_dtype);
    t->max_ulp = t->max_ulp < u ? u : t->max_ulp;
    t->sum_ulp += u;
  }
  return DoubleBits(ad);
}

// Step 1 for one thread: its partial, its elements' keys into keys[i].
ATTNAUDIT_HOST_DEVICE inline DriftTotals StridedPartial(
    const DriftInput& in, long long thread, long long threads,
    unsigned long long* keys) {
  const double tiny = SmallestNormal(in.ulp_dtype);
  DriftTotals t;
  for (long long i = thread; i < in.n; i += threads) {
    keys[i] = AddDriftElement(in, i, tiny, &t);
  }
  return t;
}

// Consecutive block partials per thread in the last block's combine.
ATTNAUDIT_HOST_DEVICE inline int BlocksPerThread(int blocks) {
  return (blocks + kDriftThreads - 1) / kDriftThreads;
}

// The shift of pass p's digit in a key.
ATTNAUDIT_HOST_DEVICE inline int DigitShift(int pass) {
  const int shift = 64 - kDigitBits * (pass + 1);
  return shift < 0 ? 0 : shift;
}

// Whether key agrees with `prefix` on the digits of passes before `pass`.
ATTNAUDIT_HOST_DEVICE inline bool MatchesPrefix(unsigned long long key,
                                                unsigned long long prefix,
                                                int pass) {
  if (key == kNotCounted) return false;
  if (pass == 0) return true;
  const int high = 64 - kDigitBits * pass;  // bits below the known digits
  return (key >> high) == (prefix >> high);
}

ATTNAUDIT_HOST_DEVICE inline int DigitOf(unsigned long long key, int pass) {
  const int shift = DigitShift(pass);
  const int width = 64 - kDigitBits * pass - shift;
  return static_cast<int>((key >> shift) & ((1ull << width) - 1));
}

// The digit d where the k-th smallest (1-based) of the keys counted in
// hist lies: the least d with hist[0] + ... + hist[d] >= k. *below gets
// hist[0] + ... + hist[d - 1]. bins: kDigitBins.
ATTNAUDIT_HOST_DEVICE inline int SelectDigit(const unsigned int* hist,
                                             unsigned long long k,
                                             unsigned long long* below) {
  unsigned long long sum = 0;
  for (int d = 0; d < kDigitBins; ++d) {
    if (sum + hist[d] >= k) {
      *below = sum;
      return d;
    }
    sum += hist[d];
  }
  *below = sum;
  return kDigitBins - 1;
}

// The p99's rank among `count` counted elements (nearest rank).
ATTNAUDIT_HOST_DEVICE inline unsigned long long P99Rank(long long count) {
  return static_cast<unsigned long long>((99 * count + 99) / 100);
}

}  // namespace kmath
}  // namespace attnaudit

#endif  // ATTNAUDIT_KERNELS_MATH_DRIFT_REDUCE_H_
