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
#      same-run device-to-device copy at 4k/32k/128k, the W1 audit split
#      into transfer and compute, the ring's time per round;
#   4. writes everything to OUT (default gpu-results/, or $OUT / $1):
#      machine.txt, configure.log, build.log, tests.log, e2e.log,
#      bench.txt (the markdown tables), bench.json, summary.txt.
# Every phase is time-boxed, and all of them together by DEADLINE_S
# (default 460 s, so the whole run ends inside 8 minutes); a failing phase
# is recorded and the script goes on, so one run always brings back what
# it could measure. Exit status: 0 when every phase passed.
# Needs the Debian packages `make deps` installs (the build's libraries)
# plus CUDA 12+ with nvcc and, for gangs, NCCL.
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

if [[ "${SKIP_BUILD:-0}" != 1 ]]; then
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

phase tests 150 "$OUT/tests.log" \
  bash -c "cd '$BUILD' && ctest -V \
    -R '^(cuda_backend_test|cuda_transports_test|kernel_math_test|device_pool_test)$'"
# The verdict line, and how many GPU tests skipped (none should, on a GPU).
grep -E 'tests passed|Failed|SKIPPED \] [0-9]+ tests?,' "$OUT/tests.log" |
  tee -a "$OUT/summary.txt"
phase devices-all 60 "$OUT/e2e.log" \
  bash "$ROOT/tests/e2e/devices_all_e2e.sh" "$BUILD/bin/attnaudit-server" \
    "$BUILD/bin/attnaudit"
phase bench 240 "$OUT/bench.txt" \
  "$BUILD/bin/attnaudit_bench_gpu" --repeats 5 --json "$OUT/bench.json"
note "done in $SECONDS s; results in $OUT"
exit $STATUS
