#!/usr/bin/env bash
# Runs one libFuzzer target for a bounded time on a scratch copy of its seed
# corpus and regression inputs (the committed directories are never
# written). Fails, printing the crash and keeping the input, when the
# fuzzer finds one; otherwise prints the executions it ran.
#
# usage: run_fuzz.sh FUZZER SECONDS SEED_DIR REGRESSION_DIR
#   ATTNAUDIT_FUZZ_ARTIFACTS  where crash inputs are copied (default /tmp)
set -euo pipefail

FUZZER=$1
SECONDS_TO_RUN=$2
SEEDS=$3
REGRESSIONS=$4
NAME=$(basename "$FUZZER")

WORK=$(mktemp -d "${TMPDIR:-/tmp}/attnaudit_${NAME}_XXXXXX")
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/corpus" "$WORK/artifacts"
cp "$SEEDS"/* "$WORK/corpus/" 2>/dev/null || true
cp "$REGRESSIONS"/* "$WORK/corpus/" 2>/dev/null || true

rc=0
ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1} \
UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} \
  "$FUZZER" -max_total_time="$SECONDS_TO_RUN" -timeout=20 \
    -rss_limit_mb=2048 -malloc_limit_mb=1024 -print_final_stats=1 \
    -artifact_prefix="$WORK/artifacts/" "$WORK/corpus" \
    >"$WORK/log" 2>&1 || rc=$?

execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$WORK/log" | tail -1)
crashes=$(find "$WORK/artifacts" -type f | wc -l)
echo "$NAME: ${execs:-0} executions in ${SECONDS_TO_RUN} s, corpus $(ls "$WORK/corpus" | wc -l) inputs, crashes $crashes"
if [[ $rc -ne 0 || $crashes -ne 0 ]]; then
  tail -n 60 "$WORK/log"
  keep=${ATTNAUDIT_FUZZ_ARTIFACTS:-/tmp}
  for f in "$WORK"/artifacts/*; do
    [[ -f $f ]] || continue
    cp "$f" "$keep/$NAME-$(basename "$f")"
    echo "crash input kept: $keep/$NAME-$(basename "$f") (add it to $REGRESSIONS)"
  done
  exit 1
fi
