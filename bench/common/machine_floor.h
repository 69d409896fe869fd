// Measures this machine's floor for memory-bound and FMA-bound work, in the
// same process and run as the benchmark that compares against it: read
// bandwidth (all threads streaming a buffer far larger than the caches) and
// the fp64 / fp32 FMA peaks (independent vector FMA chains, all threads).
// Not thread-safe; run from one thread (it spawns its own).
#ifndef ATTNAUDIT_BENCH_COMMON_MACHINE_FLOOR_H_
#define ATTNAUDIT_BENCH_COMMON_MACHINE_FLOOR_H_

namespace attnaudit::bench {

struct MachineFloor {
  int threads = 0;
  double read_bytes_per_second = 0;
  double fp64_flops_per_second = 0;  // an FMA counts 2 flops
  double fp32_flops_per_second = 0;
};

// Best of `repeats` runs of each probe.
MachineFloor MeasureMachineFloor(int threads, int repeats = 5);

}  // namespace attnaudit::bench

#endif  // ATTNAUDIT_BENCH_COMMON_MACHINE_FLOOR_H_
