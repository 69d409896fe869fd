#include "core/attention/units.h"

#include <algorithm>

namespace attnaudit {

std::vector<std::vector<KvUnit>> PlanUnits(const Snapshot& snapshot,
                                           const ResolvedLayout& layout) {
  const int64_t P = layout.dims.page_size;
  const bool per_token = snapshot.cp.world_size > 1 &&
                         snapshot.cp.sharding == CpSharding::kTokenInterleaved;
  std::vector<std::vector<KvUnit>> units(layout.seq_lens.size());
  for (size_t b = 0; b < layout.seq_lens.size(); ++b) {
    const int64_t L = layout.seq_lens[b];
    std::vector<KvUnit>& row = units[b];
    row.reserve(static_cast<size_t>((L + P - 1) / P));
    for (int64_t block = 0; block * P < L; ++block) {
      const int64_t n = std::min(P, L - block * P);
      KvUnit unit;
      unit.block = static_cast<int32_t>(block);
      unit.rank = snapshot.cp.world_size > 1
                      ? layout.block_owners[b][static_cast<size_t>(block)]
                      : 0;
      if (!per_token) {
        unit.count = static_cast<int32_t>(n);
        row.push_back(unit);
        continue;
      }
      // Token interleaving: one unit per run of tokens with the same owner.
      for (int64_t t = 0; t < n; ++t) {
        const int32_t rank = TokenOwner(snapshot, layout,
                                        static_cast<int64_t>(b), block * P + t);
        if (t == 0 || rank != unit.rank) {
          if (t > 0) row.push_back(unit);
          unit.first = static_cast<int32_t>(t);
          unit.count = 0;
          unit.rank = rank;
        }
        ++unit.count;
      }
      row.push_back(unit);
    }
  }
  return units;
}

}  // namespace attnaudit
