#!/usr/bin/env bash
# The prepared GPU check (docs/PERF.md, "GPU backend"): one command for a
# short loan of a GPU machine, under 8 minutes on an H200 with 16 cores.
#   1. configures a clean build with the CUDA backend for sm_90
#      (-DATTNAUDIT_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90) and builds
#      only what the check runs;
#   2. runs the GPU tests (cuda_backend_test: R vs CPU, P reproducible and
#      within tolerance, CP replays on the CUDA-local ring for W = 1..4,
#      device drift, the pool fallback, a whole audit; cuda_transports_test:
#      the CUDA-local ring transport on the ring protocol), the per-block math
#      on the CPU (kernel_math_test), the device pool (device_pool_test)
#      and `--devices all` end to end;
#   3. runs the benchmark (attnaudit_bench_gpu): P kernel bandwidth vs a
#      same-run device-to-device copy at 4k/32k/128k (B=8, and B=1 at
#      32k/128k), the second step's share (P's unit tree), the W1 audit split into
#      transfer and compute (and again with one staging-copy thread, the
#      parallel copy's baseline), the ring's time per round, the drift
#      statistics on the GPU vs the CPU;
#   4. writes everything to OUT (default gpu-results/, or $OUT / $1):
#      machine.txt, configure.log, build.log, tests.log (with the "[ P bits ]"
#      lines: how many of P's outputs have the CPU's bits), e2e.log,
#      bench.txt (the markdown tables), bench_b1.txt, bench_one_block.txt
#      (the one-block pass, the split-KV baseline), bench_one_run.txt (a
#      run a stage, the staged pass's baseline), bench_copy1.txt (one
#      staging-copy thread), bench.json,
#      summary.txt.
# Every phase is time-boxed, and all of them together by DEADLINE_S
# (default 460 s, so the whole run ends inside 8 minutes); a failing phase
# is recorded and the script goes on, so one run always brings back what
# it could measure. Exit status: 0 when every phase passed.
# Needs the Debian packages `make deps` installs (the build's libraries)
# plus CUDA 12+ with nvcc and, for gangs, NCCL -- or, on a machine that has
# only a driver, PREBUILT=DIR: the binaries and libraries bench/gpu/
# bundle.sh packed from such a build elsewhere (no configure or build
# phase; the tests run as plain gtest binaries).
# BENCH_ARGS replaces the benchmark's default arguments (--repeats 5).
# usage: bench/gpu/device-check.sh [OUT]
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${1:-${OUT:-gpu-results}}
BUILD=${BUILD_DIR:-$ROOT/build-device-check}
JOBS=${JOBS:-$(nproc)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
DEADLINE_S=${DEADLINE_S:-460}
STATUS=0
SECONDS=0
# nvcc where the CUDA toolkit installs it, when it is not on PATH.
if ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
note() { echo "[$(printf '%3d' "$SECONDS") s] $*" | tee -a "$OUT/summary.txt"; }
phase() {  # phase NAME TIMEOUT_S LOG CMD...
  local name=$1 limit=$2 log=$3
  shift 3
  local left=$((DEADLINE_S - SECONDS))
  ((left < limit)) && limit=$left
  if ((limit <= 0)); then
    note "SKIP $name (the ${DEADLINE_S} s deadline has passed)"
    STATUS=1
    return
  fi
  if timeout "$limit" "$@" >"$log" 2>&1; then
    note "PASS $name"
  else
    note "FAIL $name (exit $?; see $(basename "$log"))"
    STATUS=1
  fi
}

: >"$OUT/summary.txt"
{
  nvidia-smi || true
  nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem --format=csv || true
  nvcc --version || true
  lscpu | head -20 || true
  git -C "$ROOT" log -1 --oneline || true
} >"$OUT/machine.txt" 2>&1
note "machine: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"

GPU_TESTS=(cuda_backend_test cuda_transports_test kernel_math_test
  device_pool_test)
if [[ -n "${PREBUILT:-}" ]]; then
  rm -rf "$BUILD" && mkdir -p "$BUILD" && tar -C "$BUILD" -xJf "$PREBUILT"
  BIN=$BUILD/bin
  # The driver and NCCL are the machine's: NCCL where the system or a
  # Python wheel (nvidia-nccl-*) put it.
  nccl=$(ldconfig -p 2>/dev/null | awk '/libnccl\.so\.2 /{print $NF; exit}')
  [[ -n "$nccl" ]] || nccl=$(find / -xdev -name libnccl.so.2 2>/dev/null | head -1)
  for dir in /usr/local/nvidia/lib64 /usr/local/nvidia/lib ${nccl:+$(dirname "$nccl")}; do
    [[ -d $dir ]] && LD_LIBRARY_PATH=$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  done
  export LD_LIBRARY_PATH=$BUILD/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  note "prebuilt binaries of $(cut -c1-12 "$BUILD/commit.txt"); NCCL: ${nccl:-none found}"
  TEST_CMD="f=0; for t in ${GPU_TESTS[*]}; do echo \"=== \$t\"; \
    '$BIN'/\$t || f=1; done; exit \$f"
else
  BIN=$BUILD/bin
  TEST_CMD="cd '$BUILD' && ctest -V -R '^($(IFS='|'; echo "${GPU_TESTS[*]}"))\$'"
fi

if [[ -z "${PREBUILT:-}" && "${SKIP_BUILD:-0}" != 1 ]]; then
  rm -rf "$BUILD"
  phase configure 120 "$OUT/configure.log" \
    cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release \
      -DATTNAUDIT_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
      -DATTNAUDIT_BUILD_TESTS=ON -DATTNAUDIT_BUILD_BENCH=ON
  grep 'backends:' "$OUT/configure.log" | tee -a "$OUT/summary.txt"
  phase build 300 "$OUT/build.log" \
    cmake --build "$BUILD" -j "$JOBS" --target cuda_backend_test \
      cuda_transports_test kernel_math_test device_pool_test attnaudit_bench_gpu \
      attnaudit-server attnaudit
fi

phase tests 150 "$OUT/tests.log" bash -c "$TEST_CMD"
# The verdict line, and how many GPU tests skipped (none should, on a GPU).
grep -E 'tests passed|Failed|FAILED|PASSED|SKIPPED \] [0-9]+ tests?,' "$OUT/tests.log" |
  tee -a "$OUT/summary.txt"
phase devices-all 60 "$OUT/e2e.log" \
  bash "$ROOT/tests/e2e/devices_all_e2e.sh" "$BIN/attnaudit-server" "$BIN/attnaudit"
phase bench 240 "$OUT/bench.txt" \
  "$BIN/attnaudit_bench_gpu" ${BENCH_ARGS:---repeats 5} --json "$OUT/bench.json"
# One decode row, the split-KV pass's case (8 KV heads on 132 SMs), and
# both batches again with the one-block pass (--max-splits 1): the split's
# baseline, measured in the same run.
phase bench-b1 60 "$OUT/bench_b1.txt" \
  "$BIN/attnaudit_bench_gpu" --batch 1 --contexts 32768,131072 --repeats 3 \
  --bandwidth-only
phase bench-one-block 90 "$OUT/bench_one_block.txt" bash -c \
  "'$BIN/attnaudit_bench_gpu' --max-splits 1 --repeats 3 --bandwidth-only &&
   '$BIN/attnaudit_bench_gpu' --max-splits 1 --batch 1 --repeats 3 \
     --contexts 32768,131072 --bandwidth-only"
# The staged pass's baseline: one run (page) a stage, the same binary.
phase bench-one-run 90 "$OUT/bench_one_run.txt" bash -c \
  "'$BIN/attnaudit_bench_gpu' --max-stage-runs 1 --repeats 3 --bandwidth-only &&
   '$BIN/attnaudit_bench_gpu' --max-stage-runs 1 --batch 1 --repeats 3 \
     --contexts 32768,131072 --bandwidth-only"
# The specialised kernels' baseline: the generic kernel, the same binary.
phase bench-generic 90 "$OUT/bench_generic.txt" bash -c \
  "'$BIN/attnaudit_bench_gpu' --generic-kernels --repeats 3 --bandwidth-only &&
   '$BIN/attnaudit_bench_gpu' --generic-kernels --batch 1 --repeats 3 \
     --contexts 32768,131072 --bandwidth-only"
# The unit tree's every-level carry (registers) against the default (local
# memory) in the bench phase: the merge column.
phase bench-tree-every-level 90 "$OUT/bench_tree_every_level.txt" bash -c \
  "'$BIN/attnaudit_bench_gpu' --tree-every-level --repeats 3 --bandwidth-only &&
   '$BIN/attnaudit_bench_gpu' --tree-every-level --batch 1 --repeats 3 \
     --contexts 32768,131072 --bandwidth-only"
# The upload's baseline: the staging copies on one host thread.
phase bench-copy1 90 "$OUT/bench_copy1.txt" \
  "$BIN/attnaudit_bench_gpu" --contexts 4096 --repeats 5 --copy-threads 1
note "done in $SECONDS s; results in $OUT"
exit $STATUS
