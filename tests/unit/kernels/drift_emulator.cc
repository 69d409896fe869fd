// EmulateDrift (kernel_emulator.h): kernels/drift_kernels.cu's launches
// with their blocks and threads replaced by loops.
#include <algorithm>
#include <vector>

#include "tests/unit/kernels/kernel_emulator.h"

namespace attnaudit {
namespace testing {
namespace {

using kmath::DriftTotals;

// The kernels' CombineTree: tree[0] <- the fixed tree over the block.
DriftTotals CombineTree(std::vector<DriftTotals> tree) {
  for (int half = kmath::kDriftThreads / 2; half >= 1; half /= 2) {
    for (int t = 0; t < half; ++t)
      kmath::CombineTotals(&tree[t], tree[t + half]);
  }
  return tree[0];
}

// One select pass: the histogram of the keys that match the prefix so
// far, and the digit the last block picks from it.
void SelectPass(const std::vector<unsigned long long>& keys, int pass,
                unsigned long long* prefix, unsigned long long* k) {
  std::vector<unsigned int> hist(kmath::kDigitBins, 0);
  for (unsigned long long key : keys) {
    if (kmath::MatchesPrefix(key, *prefix, pass)) {
      ++hist[kmath::DigitOf(key, pass)];
    }
  }
  unsigned long long below = 0;
  const int digit = kmath::SelectDigit(hist.data(), *k, &below);
  *k -= below;
  *prefix |= static_cast<unsigned long long>(digit) << kmath::DigitShift(pass);
}

}  // namespace

DriftTotals EmulateDrift(const kmath::DriftInput& in) {
  const int blocks = kmath::DriftBlocks(in.n);
  const long long threads =
      static_cast<long long>(blocks) * kmath::kDriftThreads;
  std::vector<unsigned long long> keys(static_cast<size_t>(in.n));
  std::vector<DriftTotals> partials(static_cast<size_t>(blocks));
  std::vector<DriftTotals> tree(kmath::kDriftThreads);
  for (int b = 0; b < blocks; ++b) {
    for (int t = 0; t < kmath::kDriftThreads; ++t) {
      tree[t] = kmath::StridedPartial(
          in, static_cast<long long>(b) * kmath::kDriftThreads + t, threads,
          keys.data());
    }
    partials[b] = CombineTree(tree);
  }
  const int per = kmath::BlocksPerThread(blocks);
  for (int t = 0; t < kmath::kDriftThreads; ++t) {
    tree[t] = DriftTotals();
    for (int b = t * per; b < std::min((t + 1) * per, blocks); ++b) {
      kmath::CombineTotals(&tree[t], partials[b]);
    }
  }
  DriftTotals totals = CombineTree(tree);
  unsigned long long prefix = 0;
  unsigned long long k = kmath::P99Rank(totals.count);
  for (int pass = 0; pass < kmath::kSelectPasses; ++pass) {
    SelectPass(keys, pass, &prefix, &k);
  }
  totals.p99_abs = totals.count > 0 ? kmath::BitsAsDouble(prefix) : 0.0;
  return totals;
}

}  // namespace testing
}  // namespace attnaudit
