#!/bin/bash
# quiet_build.sh DIR LOG TARGET...: builds TARGETs in the CMake build folder
# DIR with $JOBS jobs (default 2), the compiler's output going to LOG, and
# prints a line when the build has passed another tenth of its steps (at
# most one each 20 s), so that a first build (~20 min on 2 cores) shows it
# is moving without printing every compile. On failure: the last 30 lines of LOG, exit 2.
set -u
dir=$1 log=$2
shift 2
mkdir -p "$(dirname "$log")"
started=$(date +%s)
set -o pipefail
cmake --build "$dir" -j "${JOBS:-2}" --target "$@" 2>&1 | tee "$log" |
  awk -v start="$started" '
    BEGIN { said = start }
    match($0, /^\[ *[0-9]+%\]/) {
      pct = substr($0, RSTART + 1, RLENGTH - 3) + 0
      now = systime()
      if (pct >= shown + 10 && now - said >= 20) {
        shown = pct - pct % 10
        said = now
        printf "  %3d%% built (%d s)\n", shown, now - start
        fflush()
      }
    }'
rc=$?
if [ $rc -ne 0 ]; then
  echo "the build failed; the last lines of $log:"
  tail -n 30 "$log"
  exit 2
fi
echo "  built in $(( $(date +%s) - started )) s (log: $log)"
