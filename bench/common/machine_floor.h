// The machine floor: what this machine can do at best for memory-bound and
// FMA-bound work, measured in the same process and run as the benchmark
// that compares against it (the dev VMs drift by tens of percent between
// runs, so only same-run ratios are stable).
//
// Method.
// - Threads: `threads` threads, thread 0 being the caller, released
//   together; a probe's time runs until the last one finished. When
//   `threads` is the number of CPUs in the caller's affinity mask, each is
//   pinned to its own CPU while it probes (the caller's mask is restored).
// - Read bandwidth: every thread sums its own slice of a 1 GiB buffer of
//   64-bit words (far larger than any L3 here) with vectorised integer
//   adds, so the probe is bound by memory, not arithmetic. Best of
//   `repeats`.
// - FMA peaks: every thread runs independent chains acc[j] = acc[j] * a + b
//   of vector FMAs held in registers: 16 chains of 512-bit vectors
//   (AVX-512), 12 of 256-bit (AVX2 + FMA), 12 of 128-bit multiply-then-add
//   (SSE2, a CPU without FMA). A chain issues one FMA per FMA latency (4-5
//   cycles), so filling every FMA pipe (at most 2 on the x86 cores we run
//   on) needs latency x pipes = 8-10 chains; more leave headroom and still
//   fit the register file (no spills, no memory operands: checked in the
//   assembly). Each ISA is compiled with a target attribute and chosen at
//   run time whatever the build flags (a portable build's floor is a native
//   one's). One untimed run first (the core's clock ramps up), then best of
//   `repeats`; an FMA counts as 2 flops.
// - Which ISA counts: the widest the CPU runs (within `widest_isa`), both
//   for fp64 and fp32. A narrower one replaces it only when its compute
//   floor (1/fp64 + 1/fp32) is more than 5 % lower (a core that lowers its
//   clock for 512-bit code); on a tie the widest stays, so a quiet machine
//   always reports the same ISA.
// - Clock: before each timed FMA run, every thread runs a chain of
//   dependent register adds (one per cycle on any x86 core) at the same
//   time; the slowest thread's rate, best of all those runs.
//   fma_per_cycle = fp64 FLOP/s / (threads x clock x 2 x lanes) then says
//   how many vector FMAs each thread retired per cycle. At the peak it is
//   a whole number, the core's datasheet figure (Zen 3: 2 at 256-bit;
//   Zen 4: 2 at 256-bit and 1 at 512-bit, its two FMA pipes being 256 bits
//   wide; Zen 5: 2 at 512-bit); anything else means the probe shared its
//   cores with other work or the clock moved (MachineFloorText says so).
// Not thread-safe; call from one thread (it starts its own).
#ifndef ATTNAUDIT_BENCH_COMMON_MACHINE_FLOOR_H_
#define ATTNAUDIT_BENCH_COMMON_MACHINE_FLOOR_H_

#include <string>

namespace attnaudit::bench {

struct MachineFloor {
  int threads = 0;
  bool threads_pinned = false;  // each thread on its own CPU
  double read_bytes_per_second = 0;
  double fp64_flops_per_second = 0;  // an FMA counts 2 flops
  double fp32_flops_per_second = 0;
  std::string fma_isa;       // the ISA of the FMA probe that counts: avx512,
                             // avx2, sse2
  int fma_vector_bits = 0;   // its vector width: 512, 256, 128
  int fma_chains = 0;        // independent FMA chains per thread in it
  double clock_hz = 0;       // the core clock measured during the probe
  double fma_per_cycle = 0;  // fp64 vector FMAs per cycle per thread
};

// Best of `repeats` runs of each probe, on `threads` threads (>= 1).
// widest_isa limits the FMA probes: "avx2" skips AVX-512 (the floor of an
// AVX2-only CPU with this core's pipes and clock), "sse2" keeps only the
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

// One line of text: threads, bandwidth, the FMA peaks, the ISA, its width
// and chains, the clock and the FMAs per cycle.
std::string MachineFloorText(const MachineFloor& floor);

// The same floor as JSON: {"threads":N,"read_bytes_per_second":...,...}.
std::string MachineFloorJson(const MachineFloor& floor);

}  // namespace attnaudit::bench

#endif  // ATTNAUDIT_BENCH_COMMON_MACHINE_FLOOR_H_
