// The fault registry's rows, and the fault names the simulator's API takes
// and prints (ParseFault, FaultName, FaultNames and the CP versions), all
// derived from them.
#include "sim/fault_registry.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace attnaudit {
namespace {

constexpr CpFault kNoCp = CpFault::kNone;
constexpr Fault kNoFault = Fault::kNone;

// The order is the CLI's (and the evaluation draws its snapshots in it).
constexpr FaultInfo kRows[] = {
    {Fault::kStalePage, kNoCp, "stale-page", "stale-page", FaultSite::kOnePlace,
     false},
    {Fault::kSwappedPages, kNoCp, "swapped-pages", "swapped-pages",
     FaultSite::kOnePlace, false},
    {Fault::kRopeOffset, kNoCp, "rope-offset", "rope-offset", FaultSite::kHeads,
     false},
    {Fault::kKRopeTwice, kNoCp, "k-rope-twice", "k-rope-twice",
     FaultSite::kHeads, false},
    {Fault::kLseBase2, kNoCp, "lse-base2", "lse-base", FaultSite::kHeads,
     false},
    {Fault::kWrongScale, kNoCp, "wrong-scale", "wrong-scale", FaultSite::kHeads,
     false},
    {Fault::kGqaMapping, kNoCp, "gqa-mapping", "gqa-mapping", FaultSite::kHeads,
     false},
    {Fault::kDropBlock, kNoCp, "drop-block", "drop-block", FaultSite::kOnePlace,
     false},
    {Fault::kFp8Scale, kNoCp, "fp8-scale", "fp8-scale", FaultSite::kHeads,
     true},
    {Fault::kBf16RunningOut, kNoCp, "bf16-running-out", "low-precision",
     FaultSite::kHeads, false},
    {Fault::kKRopeMissing, kNoCp, "k-rope-missing", "k-rope-missing",
     FaultSite::kHeads, false},
    {Fault::kRopeStyle, kNoCp, "rope-style", "rope-style", FaultSite::kHeads,
     false},
    {Fault::kSoftcapMissing, kNoCp, "softcap-missing", "softcap-missing",
     FaultSite::kHeads, false},
    {Fault::kWindowOffByOne, kNoCp, "window-off-by-one", "window-off-by-one",
     FaultSite::kHeads, false},
    {Fault::kSinksMissing, kNoCp, "sinks-missing", "sinks-missing",
     FaultSite::kHeads, false},
    {Fault::kFp8ScaleTwice, kNoCp, "fp8-scale-twice", "fp8-scale",
     FaultSite::kHeads, true},
    {Fault::kFp8ScaleMissing, kNoCp, "fp8-scale-missing", "fp8-scale",
     FaultSite::kHeads, true},
    {Fault::kDuplicatePage, kNoCp, "duplicate-page", "duplicate-page",
     FaultSite::kOnePlace, false},
    {Fault::kFp8KScaleMissing, kNoCp, "fp8-k-scale-missing", "fp8-scale",
     FaultSite::kHeads, true},
    {kNoFault, CpFault::kDropShard, "drop-shard", "cp-missing-shard",
     FaultSite::kCpCombine, false},
    {kNoFault, CpFault::kBf16Combine, "bf16-combine", "cp-bf16-combine",
     FaultSite::kCpCombine, false},
    {kNoFault, CpFault::kLseBase2Rank, "lse-base2-rank", "cp-lse-base",
     FaultSite::kCpRank, false},
    // Its finite -3.4e38 weighs exp(-3.4e38 - lse) = 0 in the combine:
    // the final output is right, and only the rank's check sees it.
    {kNoFault, CpFault::kEmptyRankGarbage, "empty-rank-garbage", nullptr,
     FaultSite::kCpRank, false},
    {kNoFault, CpFault::kStaleRankPage, "stale-rank-page", "stale-page",
     FaultSite::kCpRank, false},
};

}  // namespace

absl::Span<const FaultInfo> FaultRegistry() { return kRows; }

const FaultInfo* FindFault(Fault fault) {
  for (const FaultInfo& row : kRows) {
    if (!row.is_cp() && row.fault == fault) return &row;
  }
  return nullptr;
}

const FaultInfo* FindCpFault(CpFault fault) {
  for (const FaultInfo& row : kRows) {
    if (row.is_cp() && row.cp_fault == fault) return &row;
  }
  return nullptr;
}

std::vector<std::string> FaultNames() {
  std::vector<std::string> names;
  for (const FaultInfo& row : kRows) {
    if (!row.is_cp()) names.push_back(row.name);
  }
  return names;
}

std::string FaultName(Fault fault) {
  if (fault == Fault::kNone) return "none";
  const FaultInfo* row = FindFault(fault);
  return row != nullptr ? row->name : "unknown";
}

absl::StatusOr<Fault> ParseFault(const std::string& name) {
  if (name == "none") return Fault::kNone;
  for (const FaultInfo& row : kRows) {
    if (!row.is_cp() && name == row.name) return row.fault;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("fault: unknown fault '", name,
                   "'; known faults: ", absl::StrJoin(FaultNames(), ", ")));
}

std::vector<std::string> CpFaultNames() {
  std::vector<std::string> names;
  for (const FaultInfo& row : kRows) {
    if (row.is_cp()) names.push_back(row.name);
  }
  return names;
}

std::string CpFaultName(CpFault fault) {
  if (fault == CpFault::kNone) return "none";
  const FaultInfo* row = FindCpFault(fault);
  return row != nullptr ? row->name : "unknown";
}

absl::StatusOr<CpFault> ParseCpFault(const std::string& name) {
  if (name == "none") return CpFault::kNone;
  for (const FaultInfo& row : kRows) {
    if (row.is_cp() && name == row.name) return row.cp_fault;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("cp_fault: unknown fault '", name,
                   "'; known faults: ", absl::StrJoin(CpFaultNames(), ", ")));
}

}  // namespace attnaudit
