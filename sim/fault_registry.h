// The fault registry: one row per fault class the simulator can inject,
// the one place that names a fault and says what the audit should make of
// it. The CLI's names (ParseFault, FaultNames, ...), the evaluation's
// expected diagnosis (bench/diagnosis_eval) and the checks that every fault
// has a hypothesis and a documentation row (tests/unit/sim) all read these
// rows; docs/EXTENDING.md, "A fault class", walks through adding one.
//
// Hypotheses are named by their report spelling (core/diagnosis
// HypothesisNames()), not by a diagnosis type: sim/ and core/diagnosis do
// not depend on each other, and the test that links both checks the names.
// Immutable, so thread-safe.
#ifndef ATTNAUDIT_SIM_FAULT_REGISTRY_H_
#define ATTNAUDIT_SIM_FAULT_REGISTRY_H_

#include "absl/types/span.h"
#include "sim/simulator.h"

namespace attnaudit {

// Where the audit sees a fault, which says what must name it.
enum class FaultSite {
  kHeads,      // the whole computation: the diagnosis names the heads
  kOnePlace,   // one row's logical block(s) and page(s): the diagnosis
               // names them as SynthDetails::fault_row/block/page say
  kCpRank,     // one CP rank's own partial: that rank's check drifts
  kCpCombine,  // the CP combine: the combine check drifts
};

struct FaultInfo {
  Fault fault;       // Fault::kNone for a CP fault
  CpFault cp_fault;  // CpFault::kNone for a fault of the single engine
  const char* name;  // --fault / --cp-fault, and the docs' table rows
  // The top diagnosis an audit of the faulty snapshot should give;
  // nullptr when the engine's final output is right and only a CP check
  // sees the fault (the rank's own partial).
  const char* hypothesis;
  FaultSite site;
  // The fault shows only on an fp8 KV cache (AdjustForFault switches
  // the cache to fp8_e4m3).
  bool needs_fp8_cache;

  bool is_cp() const { return cp_fault != CpFault::kNone; }
};

// Every fault class (kNone is not one): the single engine's faults first,
// then the CP faults, each in the order the CLI lists them.
absl::Span<const FaultInfo> FaultRegistry();

// The row of a fault; nullptr for kNone.
const FaultInfo* FindFault(Fault fault);
const FaultInfo* FindCpFault(CpFault fault);

}  // namespace attnaudit

#endif  // ATTNAUDIT_SIM_FAULT_REGISTRY_H_
