#!/usr/bin/env bash
# `make run`'s choice of backend and devices (ctest make_run_test), with
# fake cmake, nvidia-smi and attnaudit-server first on PATH, so nothing is
# compiled and no server starts: each case runs the real Makefile's `run`
# recipe in a temporary folder against a fake build folder whose backends
# line says CUDA on (nvcc found) or off, and checks which folder is built,
# whether a CPU-only folder is configured (CUDA off), the --devices the
# server is started with, and what the lines printed say.
#   no GPU, CUDA build       CPU-only server in build/run-cpu, --devices=cpu,
#                            the CUDA kernels are not built; says CUDA=1,
#                            names that folder's CLI, logs the build
#   GPU seen, CUDA build     build/, --devices=all
#   CUDA=1 without a GPU     build/, --devices=all
#   CUDA=0 with a GPU        build/run-cpu, --devices=cpu
#   no nvcc (CUDA off)       build/, --devices=cpu, no second configure;
#                            says how to get the CUDA backend
#   GPU seen, no nvcc        build/, --devices=cpu, says why
#   CUDA=1, no nvcc          exit 2, nothing built or started
#   CUDA=yes                 exit 2
#   CUDA in the environment  1 or 0 counts; anything else (a toolkit path)
#                            is not this setting
#   SERVER_FLAGS             come after --devices (they override it)
# usage: make_run_test.sh REPO_ROOT
set -u
ROOT=$(cd "$1" && pwd)
# Under `make test` ctest inherits the outer make's flags and variables.
unset CUDA MAKEFLAGS MFLAGS MAKELEVEL MAKEOVERRIDES
PASSED=0
FAILED=0
ok() { PASSED=$((PASSED + 1)); echo "PASS  $1"; }
fail() {
  FAILED=$((FAILED + 1)); echo "FAIL  $1"
  [[ -n "${2:-}" ]] && echo "$2" | sed 's/^/      /' | head -40
}

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
FAKE=$TMP/fake-bin
mkdir -p "$FAKE"

# cmake -S SRC -B DIR ARGS...: a configured folder whose backends line
# follows -DATTNAUDIT_ENABLE_CUDA; cmake --build DIR ...: a fake server.
cat >"$FAKE/cmake" <<'EOF'
#!/usr/bin/env bash
echo "cmake $*" >>"$FAKE_LOG"
if [[ $1 == --build ]]; then
  mkdir -p "$2/bin"
  printf '#!/bin/sh\necho "SERVER $0 $*"\n' >"$2/bin/attnaudit-server"
  chmod +x "$2/bin/attnaudit-server"
  exit 0
fi
dir=""
cuda="CUDA on (AUTO: nvcc 13.0 found; fake)"
while [[ $# -gt 0 ]]; do
  case $1 in
    -B) dir=$2; shift ;;
    -DATTNAUDIT_ENABLE_CUDA=OFF) cuda="CUDA off (ATTNAUDIT_ENABLE_CUDA=OFF)" ;;
  esac
  shift
done
mkdir -p "$dir"
touch "$dir/CMakeCache.txt"
echo "backends: CPU on (fake), $cuda" >"$dir/attnaudit-backends.txt"
EOF
# nvidia-smi -L: FAKE_GPUS GPUs, or the error of a machine without a driver.
cat >"$FAKE/nvidia-smi" <<'EOF'
#!/usr/bin/env bash
if [[ ${FAKE_GPUS:-0} -gt 0 ]]; then
  for ((i = 0; i < FAKE_GPUS; i++)); do
    echo "GPU $i: NVIDIA H200 (UUID: GPU-fake-$i)"
  done
  exit 0
fi
echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver." >&2
exit 9
EOF
chmod +x "$FAKE/cmake" "$FAKE/nvidia-smi"

# run_case NAME CUDA_LINE GPUS MAKE_ARGS...: a fresh folder whose build/
# was configured with CUDA on or off (CUDA_LINE), then `make run`. Sets OUT
# (stdout + stderr), RC and LOG (the cmake calls).
run_case() {
  local name=$1 cuda_line=$2 gpus=$3
  shift 3
  CASE=$TMP/$name
  mkdir -p "$CASE/build"
  touch "$CASE/build/CMakeCache.txt"
  echo "backends: CPU on (fake), $cuda_line" >"$CASE/build/attnaudit-backends.txt"
  : >"$CASE/cmake.log"
  OUT=$(cd "$CASE" && PATH="$FAKE:$PATH" FAKE_LOG="$CASE/cmake.log" \
        FAKE_GPUS=$gpus make -s --no-print-directory -f "$ROOT/Makefile" run \
        APT_PACKAGES= BUILD_DIR=build "$@" 2>&1)
  RC=$?
  LOG=$(cat "$CASE/cmake.log")
}

expect() {  # NAME CONDITION...: pass when the condition (a command) holds
  local what=$1
  shift
  if "$@"; then ok "$what"; else fail "$what" "exit $RC
$OUT
cmake calls:
$LOG"; fi
}
has() { [[ $1 == *"$2"* ]]; }
lacks() { [[ $1 != *"$2"* ]]; }

CUDA_ON="CUDA on (AUTO: nvcc 13.0 found; kernels for CUDA architectures 90; the server still audits on the CPU unless started with --devices=all or a GPU list)"
CUDA_NO_NVCC="CUDA off (AUTO: nvcc not found)"

run_case nvcc-no-gpu "$CUDA_ON" 0
expect "no GPU, CUDA build: exit 0" [ "$RC" = 0 ]
expect "no GPU, CUDA build: configures a CPU-only folder (CUDA, tests, benchmarks off)" \
  has "$LOG" "-B build/run-cpu"
expect "  ... with -DATTNAUDIT_ENABLE_CUDA=OFF -DATTNAUDIT_BUILD_TESTS=OFF" \
  has "$LOG" "-DATTNAUDIT_ENABLE_CUDA=OFF -DATTNAUDIT_BUILD_TESTS=OFF -DATTNAUDIT_BUILD_BENCH=OFF"
expect "no GPU, CUDA build: builds the server there, not in build/ (no CUDA kernels)" \
  [ "$(grep -c -- '--build' <<<"$LOG")" = 1 ] && has "$LOG" "--build build/run-cpu -j"
expect "no GPU, CUDA build: starts build/run-cpu's server with --devices=cpu" \
  has "$OUT" "SERVER build/run-cpu/bin/attnaudit-server --devices=cpu"
expect "no GPU, CUDA build: prints the started build's backends line (CUDA off)" \
  has "$OUT" "backends: CPU on (fake), CUDA off (ATTNAUDIT_ENABLE_CUDA=OFF)"
expect "no GPU, CUDA build: says CPU, why, and how to use GPUs (CUDA=1)" \
  has "$OUT" "CPU backend (--devices=cpu; nvidia-smi sees no GPU)"
expect "  ... and make run CUDA=1" has "$OUT" "make run CUDA=1"
expect "no GPU, CUDA build: never prints the CUDA build's backends line" \
  lacks "$OUT" "kernels for CUDA architectures"
expect "no GPU, CUDA build: names the CLI of the folder it built" \
  has "$OUT" "the CLI for a second terminal is build/run-cpu/bin/attnaudit"
expect "no GPU, CUDA build: the compiler's output goes to a log, not the screen" \
  has "$OUT" "log: build/run-cpu/run-build.log"

run_case nvcc-gpu "$CUDA_ON" 2
expect "GPU seen, CUDA build: builds build/ (the CUDA backend) and no other folder" \
  [ "$(grep -c -- '--build build -j' <<<"$LOG")" = 1 ] && lacks "$LOG" "run-cpu"
expect "GPU seen, CUDA build: starts with --devices=all" \
  has "$OUT" "SERVER build/bin/attnaudit-server --devices=all"
expect "GPU seen, CUDA build: says so, why, and how to run on the CPU" \
  has "$OUT" "--devices=all; nvidia-smi sees 2 GPU(s)"
expect "  ... (make run CUDA=0)" has "$OUT" "make run CUDA=0"

run_case cuda1-no-gpu "$CUDA_ON" 0 CUDA=1
expect "CUDA=1 without a GPU: build/, --devices=all" \
  has "$OUT" "SERVER build/bin/attnaudit-server --devices=all"
expect "CUDA=1 without a GPU: no CPU-only folder" lacks "$LOG" "run-cpu"

run_case cuda0-gpu "$CUDA_ON" 2 CUDA=0
expect "CUDA=0 with a GPU: build/run-cpu, --devices=cpu" \
  has "$OUT" "SERVER build/run-cpu/bin/attnaudit-server --devices=cpu"
expect "CUDA=0 with a GPU: says why (CUDA=0)" has "$OUT" "--devices=cpu; CUDA=0"

run_case no-nvcc "$CUDA_NO_NVCC" 0
expect "no nvcc: builds build/ only, configures nothing" \
  [ "$LOG" = "cmake --build build -j 2 --target attnaudit-server attnaudit" ]
expect "no nvcc: starts build/'s server with --devices=cpu" \
  has "$OUT" "SERVER build/bin/attnaudit-server --devices=cpu"
expect "no nvcc: prints build/'s backends line" \
  has "$OUT" "backends: CPU on (fake), CUDA off (AUTO: nvcc not found)"
expect "no nvcc: says how to get the CUDA backend" \
  has "$OUT" "-DATTNAUDIT_ENABLE_CUDA=ON, then make run CUDA=1"

run_case no-nvcc-gpu "$CUDA_NO_NVCC" 1
expect "GPU seen, no nvcc: --devices=cpu" \
  has "$OUT" "SERVER build/bin/attnaudit-server --devices=cpu"
expect "GPU seen, no nvcc: says the build has no CUDA backend and why" \
  has "$OUT" "nvidia-smi sees 1 GPU(s), but this build has no CUDA backend: CUDA off (AUTO: nvcc not found)"

run_case cuda1-no-nvcc "$CUDA_NO_NVCC" 1 CUDA=1
expect "CUDA=1, no nvcc: exit 2, nothing built or started" \
  [ "$RC" = 2 ] && [ -z "$LOG" ] && lacks "$OUT" "SERVER"
expect "CUDA=1, no nvcc: says why and what to do" \
  has "$OUT" "CUDA=1, but build has no CUDA backend: CUDA off (AUTO: nvcc not found)"

run_case cuda-bad "$CUDA_ON" 0 CUDA=yes
expect "CUDA=yes: exit 2 naming the values" \
  [ "$RC" = 2 ] && has "$OUT" "expected CUDA=1" && lacks "$OUT" "SERVER"

# CUDA in the environment: 1/0 count, anything else (a path) is ignored.
export CUDA=/usr/local/cuda
run_case env-path "$CUDA_ON" 0
expect "CUDA=/usr/local/cuda in the environment is ignored (CPU, no GPU seen)" \
  [ "$RC" = 0 ] && has "$OUT" "--devices=cpu; nvidia-smi sees no GPU"
export CUDA=1
run_case env-1 "$CUDA_ON" 0
expect "CUDA=1 in the environment counts" \
  has "$OUT" "SERVER build/bin/attnaudit-server --devices=all"
unset CUDA

run_case server-flags "$CUDA_NO_NVCC" 0 "SERVER_FLAGS=--devices=cuda:0 --log-level=debug"
expect "SERVER_FLAGS come after --devices" \
  has "$OUT" "SERVER build/bin/attnaudit-server --devices=cpu --devices=cuda:0 --log-level=debug"

echo "$PASSED passed, $FAILED failed"
[[ $FAILED -eq 0 ]]
