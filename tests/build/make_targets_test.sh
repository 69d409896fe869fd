#!/usr/bin/env bash
# The Makefile's user-facing targets (ctest make_targets_test):
#   * `make run` builds only attnaudit-server and the CLI (no tests, no
#     benchmarks) and prints the backends line before starting the server;
#   * `make demo` builds only the CLI, quietly, and shows the report;
#   * `make test` builds everything in the same folder (nothing twice);
#   * the configure step wrote the backends line: which backends and why.
# The dry runs (make -n) build nothing; the last check runs `make demo` for
# real against this build folder, where the CLI is already built (so its
# build step is a no-op) and with APT_PACKAGES empty (no apt).
# usage: make_targets_test.sh REPO_ROOT BUILD_DIR
set -u
ROOT=$1
BUILD=$2
PASSED=0
FAILED=0
ok() { PASSED=$((PASSED + 1)); echo "PASS  $1"; }
fail() { FAILED=$((FAILED + 1)); echo "FAIL  $1"; [[ -n "${2:-}" ]] && echo "$2" | sed 's/^/      /' | head -20; }

# The recipe lines of TARGET that build (cmake --build ..., or
# cmake/quiet_build.sh DIR LOG TARGETS... which runs it quietly), dry-run.
builds() {
  make -s -n -C "$ROOT" "$1" BUILD_DIR="$BUILD" APT_PACKAGES= 2>&1 |
    grep -E 'cmake --build|quiet_build\.sh' || true
}

run_builds=$(builds run)
if [[ ( "$run_builds" == *"--target attnaudit-server attnaudit"* ||
        "$run_builds" == *"run-build.log attnaudit-server attnaudit;"* ) &&
      $(echo "$run_builds" | grep -cE 'cmake --build|quiet_build\.sh') == 1 ]]; then
  ok "make run builds only attnaudit-server and attnaudit"
else
  fail "make run builds only attnaudit-server and attnaudit" "$run_builds"
fi
if make -s -n -C "$ROOT" run BUILD_DIR="$BUILD" APT_PACKAGES= 2>&1 |
    grep -q 'attnaudit-backends.txt'; then
  ok "make run prints the backends line"
else
  fail "make run prints the backends line"
fi
demo_builds=$(builds demo)
if [[ "$demo_builds" == *"--target attnaudit "* || "$demo_builds" == *"--target attnaudit>"* ]]; then
  ok "make demo builds only the CLI"
else
  fail "make demo builds only the CLI" "$demo_builds"
fi
test_builds=$(builds test)
if [[ -n "$test_builds" && "$test_builds" != *"--target"* &&
      "$test_builds" == *"$BUILD"* ]]; then
  ok "make test builds everything in the same build folder"
else
  fail "make test builds everything in the same build folder" "$test_builds"
fi

line=$(cat "$BUILD/attnaudit-backends.txt" 2>/dev/null)
if [[ "$line" =~ ^backends:\ CPU\ on\ \(.+\),\ CUDA\ (on|off)\ \((AUTO|ATTNAUDIT_ENABLE_CUDA=[A-Z]+).*\)$ ]]; then
  ok "the backends line says which and why: $line"
else
  fail "the backends line says which and why" "$line"
fi

demo_dir=$(mktemp -d)
out=$(make -s -C "$ROOT" demo BUILD_DIR="$BUILD" APT_PACKAGES= DEMO_DIR="$demo_dir" 2>&1)
rc=$?
lines=$(echo "$out" | wc -l)
if [[ $rc == 0 && "$out" == *"verdict: PASS"* && "$out" != *"Building CXX"* &&
      "$out" != *"Linking"* && $lines -le 60 ]]; then
  ok "make demo shows the report, not the build ($lines lines)"
else
  fail "make demo shows the report, not the build (exit $rc, $lines lines)" "$out"
fi

rm -rf "$demo_dir"

echo "$PASSED passed, $FAILED failed"
[[ $FAILED -eq 0 ]]
