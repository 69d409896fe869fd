// Units: the granularity of the replay P's partial states.
//
// A unit is a run of consecutive tokens of one logical block that one
// context-parallel (CP) rank holds: the whole block when the snapshot has
// no CP (world size 1) or its sharding keeps blocks whole (explicit block
// owners, page interleaving, token interleaving whose interleave size is a
// multiple of the page size and aligned to pages), and the block's runs per
// rank otherwise (token interleaving with a smaller interleave size splits a
// block among ranks).
//
// P merges one fp32 partial state per unit in a tree over the unit indices
// (by block, then first token; core/attention/merge_tree.h). Because a
// unit never spans ranks, every CP replay -- whichever rank computes a
// unit, in whatever order, on whatever worker -- can rebuild P bit for bit
// by merging the same unit states in the same tree (docs/NUMERICS.md,
// "Context parallelism").
//
// Pure functions of a validated snapshot; thread-safe.
#ifndef ATTNAUDIT_CORE_ATTENTION_UNITS_H_
#define ATTNAUDIT_CORE_ATTENTION_UNITS_H_

#include <cstdint>
#include <vector>

#include "core/snapshot/snapshot.h"
#include "core/validate/validate.h"

namespace attnaudit {

struct KvUnit {
  int32_t block = 0;  // logical block of the row
  int32_t first = 0;  // first token within the block (0 .. page_size - 1)
  int32_t count = 0;  // tokens, >= 1
  int32_t rank = 0;   // CP rank holding the tokens (0 without CP)
};

// The units of every row, [B][...], ascending; every active token of a row
// is in exactly one unit.
std::vector<std::vector<KvUnit>> PlanUnits(const Snapshot& snapshot,
                                           const ResolvedLayout& layout);

}  // namespace attnaudit

#endif  // ATTNAUDIT_CORE_ATTENTION_UNITS_H_
