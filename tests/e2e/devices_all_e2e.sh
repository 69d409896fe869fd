#!/usr/bin/env bash
# `attnaudit-server --devices all` (registered with ctest): on a machine
# without a usable GPU -- or in a build without the CUDA backend -- the
# server starts on its CPU workers and says so, in its start-up log and in
# GetCapabilities (`attnaudit caps`); on a machine with GPUs it runs one
# worker per GPU. Then an audit runs on the pool it chose.
# usage: devices_all_e2e.sh ATTNAUDIT_SERVER ATTNAUDIT
set -euo pipefail

SERVER_BIN=$1
CLI=$2
WORK=$(mktemp -d "${TMPDIR:-/tmp}/attnaudit_devices_XXXXXX")
SERVER_PID=""
cleanup() {
  if [[ -n "$SERVER_PID" ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -KILL "$SERVER_PID" 2>/dev/null || true
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*" >&2
  tail -n 20 "$WORK/server.log" >&2 || true
  exit 1
}

: >"$WORK/server.log"
"$SERVER_BIN" --listen 127.0.0.1:0 --metrics-listen "" --data-dir "$WORK/data" \
  --devices all --cpu-workers 1 --threads-per-job 1 2>"$WORK/server.log" &
SERVER_PID=$!
port=""
for _ in $(seq 1 200); do
  port=$(sed -n 's/.*msg="grpc listening" addr=127\.0\.0\.1:\([0-9]*\).*/\1/p' "$WORK/server.log" | tail -1)
  [[ -n "$port" ]] && break
  kill -0 "$SERVER_PID" 2>/dev/null || fail "server exited at start"
  sleep 0.05
done
[[ -n "$port" ]] || fail "server did not report its port"
ADDR="127.0.0.1:$port"

devices_line=$(grep 'msg=devices' "$WORK/server.log" || true)
[[ -n "$devices_line" ]] || fail "no devices line in the log"
echo "log: $devices_line"
caps=$(timeout 30 "$CLI" caps --addr "$ADDR")
echo "$caps"
if [[ "$devices_line" == *"using=cuda"* ]]; then
  # GPUs visible: one worker per GPU, and caps lists them with their model.
  [[ "$caps" == *"devices: cuda:0 ["* ]] || fail "caps does not list the GPUs"
else
  # No GPU: CPU workers, and both the log and caps say why.
  [[ "$devices_line" == *"requested=all"* && "$devices_line" == *"using=cpu"* &&
     "$devices_line" == *"note="*"running on 1 CPU worker"* ]] ||
    fail "the log does not say that --devices all runs on the CPU workers"
  [[ "$caps" == *"devices: cpu:0"* ]] || fail "caps does not list the CPU worker"
  [[ "$caps" == *"cuda (unavailable"*"--devices all:"*"running on 1 CPU worker"* ]] ||
    fail "caps does not say why there is no GPU worker"
fi

timeout 60 "$CLI" synth --preset llama3-8b --batch 1 --context 64 -o "$WORK/s.pb" 2>/dev/null ||
  fail "synth failed"
out=$(timeout 60 "$CLI" audit "$WORK/s.pb" --addr "$ADDR") || fail "audit failed: $out"
[[ "$out" == *"verdict: PASS"* ]] || fail "audit did not pass: $out"

kill -TERM "$SERVER_PID"
wait "$SERVER_PID" || fail "server did not exit cleanly"
SERVER_PID=""
echo "PASS devices_all_e2e"
