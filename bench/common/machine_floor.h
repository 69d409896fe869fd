// The machine floor: what this machine can do at best for memory-bound and
// FMA-bound work, measured in the same process and run as the benchmark
// that compares against it (the dev VMs drift by tens of percent between
// runs, so only same-run ratios are stable).
//
// Method.
// - Read bandwidth: `threads` threads each sum their own slice of a 1 GiB
//   buffer of 64-bit words (far larger than any L3 here) with vectorised
//   integer adds, so the probe is bound by memory, not arithmetic. Best of
//   `repeats`.
// - FMA peaks: each of `threads` threads runs kChains independent chains
//   acc[j] = acc[j] * a + b of vector FMAs (16 chains of 512-bit vectors for
//   AVX-512, 12 of 256-bit for AVX2+FMA). A chain issues one FMA per FMA
//   latency (4-5 cycles), so filling every FMA port (2 on the x86 cores we
//   run on) needs latency x ports = 8-10 chains; 12-16 leave headroom and
//   still fit the register file (no spills, checked in the assembly). Every
//   ISA the CPU supports is probed, chosen at run time whatever the build
//   flags (a portable build's floor is the same as a native one's), and the
//   fastest counts. An FMA counts as 2 flops. Best of `repeats`.
// Not thread-safe; call from one thread (it starts its own).
#ifndef ATTNAUDIT_BENCH_COMMON_MACHINE_FLOOR_H_
#define ATTNAUDIT_BENCH_COMMON_MACHINE_FLOOR_H_

#include <string>

namespace attnaudit::bench {

struct MachineFloor {
  int threads = 0;
  double read_bytes_per_second = 0;
  double fp64_flops_per_second = 0;  // an FMA counts 2 flops
  double fp32_flops_per_second = 0;
  std::string fma_isa;  // the ISA of the fastest FMA probe: avx512, avx2, ...
  int fma_chains = 0;   // independent FMA chains per thread in that probe
};

// Best of `repeats` runs of each probe, on `threads` threads (>= 1).
// widest_isa limits the FMA probes: "avx2" skips AVX-512 (the floor of an
// AVX2-only CPU with this core's ports and clock), "sse2" keeps only the
// multiply-then-add probe (a CPU without FMA); "" probes everything.
MachineFloor MeasureMachineFloor(int threads, int repeats = 5,
                                 const std::string& widest_isa = "");

// The compute floor of `flops` of fp64 and `flops` of fp32 work, in
// seconds, from one short run (~`probe_ms` each) of the fp64 and fp32 FMA
// probes of `isa` (as MachineFloor::fma_isa names it) on `threads`
// threads: what the machine can do right now. The dev VMs' speed moves
// by tens of per cent within seconds, so a benchmark that times a stage
// right after this probe can divide the two (a paired ratio) instead of
// dividing by a floor measured minutes apart.
double ComputeFloorNow(double flops, const std::string& isa, int threads,
                       double probe_ms = 5);

// The same floor as JSON: {"threads":N,"read_bytes_per_second":...,...}.
std::string MachineFloorJson(const MachineFloor& floor);

}  // namespace attnaudit::bench

#endif  // ATTNAUDIT_BENCH_COMMON_MACHINE_FLOOR_H_
