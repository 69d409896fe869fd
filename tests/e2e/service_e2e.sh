#!/usr/bin/env bash
# End-to-end test of the real binaries on loopback (registered with ctest):
#   1. start attnaudit-server on 127.0.0.1 with kernel-picked ports and a
#      temporary data dir;
#   2. audit synthetic snapshots (attnaudit synth) over the unary and the
#      streaming call and compare with the offline `attnaudit check`;
#   3. scrape /metrics: the drift histograms moved, `promtool check metrics`
#      passes;
#   4. submit jobs, SIGKILL the server while they are in flight, restart it
#      on the same data dir, and get every acknowledged job's result exactly
#      once;
#   5. SIGTERM: the server drains and exits 0;
#   6. (after the TLS checks) a server on a Unix socket, also reading a
#      snapshot from shared memory (audit --memfd).
# Every step is bounded (timeout); nothing leaves 127.0.0.1.
#
# usage: service_e2e.sh ATTNAUDIT_SERVER ATTNAUDIT [PROMTOOL]
set -euo pipefail

SERVER_BIN=$1
CLI=$2
PROMTOOL=${3:-$(command -v promtool || true)}

WORK=$(mktemp -d "${TMPDIR:-/tmp}/attnaudit_e2e_XXXXXX")
SERVER_PID=""
cleanup() {
  if [[ -n "$SERVER_PID" ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -KILL "$SERVER_PID" 2>/dev/null || true
  fi
  if [[ "${KEEP_E2E_DIR:-0}" != 1 ]]; then rm -rf "$WORK"; fi
}
trap cleanup EXIT

fail() {
  echo "FAIL: $*" >&2
  echo "--- server log ---" >&2
  tail -n 40 "$WORK"/server*.log >&2 || true
  exit 1
}
step() { echo "== $*"; }

# Starts the server; sets SERVER_PID, ADDR, METRICS.
start_server() {
  local log=$1
  shift
  : >"$log"  # exists before the first sed below (the child creates it late)
  "$SERVER_BIN" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 \
    --data-dir "$WORK/data" --drain-timeout 20s "$@" 2>"$log" &
  SERVER_PID=$!
  local grpc_port="" metrics_port=""
  for _ in $(seq 1 200); do
    grpc_port=$(sed -n 's/.*msg="grpc listening" addr=127\.0\.0\.1:\([0-9]*\).*/\1/p' "$log" | tail -1)
    metrics_port=$(sed -n 's/.*msg="metrics listening" addr=127\.0\.0\.1:\([0-9]*\).*/\1/p' "$log" | tail -1)
    [[ -n "$grpc_port" && -n "$metrics_port" ]] && break
    kill -0 "$SERVER_PID" 2>/dev/null || fail "server exited at start"
    sleep 0.05
  done
  [[ -n "$grpc_port" && -n "$metrics_port" ]] || fail "server did not report its ports"
  ADDR="127.0.0.1:$grpc_port"
  METRICS="127.0.0.1:$metrics_port"
}

scrape() {
  curl --silent --show-error --max-time 10 "http://$METRICS/metrics"
}

# The report minus the timing line (wall times differ run to run).
strip_timings() { grep -v '^timings:'; }

step "synthesise snapshots"
timeout 60 "$CLI" synth --preset llama3-8b --context 64 -o "$WORK/small.pb" 2>/dev/null
timeout 60 "$CLI" synth --preset qwen3-8b --batch 4 --context 2048 \
  --layer 3 -o "$WORK/big.pb" 2>/dev/null
timeout 60 "$CLI" synth --preset llama3-8b --context 512 --fault stale-page \
  -o "$WORK/drift.pb" 2>/dev/null
small_bytes=$(stat -c %s "$WORK/small.pb")
big_bytes=$(stat -c %s "$WORK/big.pb")
# Unary limit between the two, so `audit` streams the big one by itself.
limit=$(( (small_bytes + big_bytes) / 2 ))

step "start the server (max message $limit bytes)"
start_server "$WORK/server1.log" --max-message-bytes "$limit" \
  --cpu-workers 1 --threads-per-job 1
timeout 30 "$CLI" caps --addr "$ADDR" >"$WORK/caps.txt" || fail "caps"
grep -q "unary" "$WORK/caps.txt" || fail "caps output"
# One fingerprint name: caps says the constant the reports and docs use.
fp_version=$(sed -n 's/.*kFingerprintVersion\[\] = "\(.*\)";/\1/p' \
  "$(dirname "$0")/../../core/fingerprint/fingerprint.h")
grep -q "fingerprints $fp_version)" "$WORK/caps.txt" ||
  fail "caps does not name the fingerprint definition $fp_version: $(head -1 "$WORK/caps.txt")"

step "audit over unary and stream equals the offline check"
for f in small big drift; do
  set +e
  timeout 60 "$CLI" check "$WORK/$f.pb" >"$WORK/$f.check"
  want=$?
  timeout 60 "$CLI" audit "$WORK/$f.pb" --addr "$ADDR" >"$WORK/$f.auto"
  got_auto=$?
  timeout 60 "$CLI" audit "$WORK/$f.pb" --addr "$ADDR" --stream >"$WORK/$f.stream"
  got_stream=$?
  set -e
  [[ $want == $got_auto && $want == $got_stream ]] ||
    fail "$f: exit codes check=$want audit=$got_auto stream=$got_stream"
  diff <(strip_timings <"$WORK/$f.check") <(strip_timings <"$WORK/$f.auto") ||
    fail "$f: audit report differs from check"
  diff <(strip_timings <"$WORK/$f.check") <(strip_timings <"$WORK/$f.stream") ||
    fail "$f: streamed report differs from check"
done
grep -q '^verdict: DRIFT' "$WORK/drift.auto" || fail "drift snapshot not DRIFT"
set +e
timeout 60 "$CLI" audit "$WORK/small.pb" --addr "$ADDR" --unary >/dev/null
small_unary=$?
timeout 60 "$CLI" audit "$WORK/big.pb" --addr "$ADDR" --unary >/dev/null 2>"$WORK/big.unary.err"
big_unary=$?
set -e
[[ $small_unary == 0 ]] || fail "small unary audit"
[[ $big_unary == 2 ]] && grep -q RESOURCE_EXHAUSTED "$WORK/big.unary.err" ||
  fail "a unary request past the limit must be refused (exit $big_unary)"
timeout 60 "$CLI" audit "$WORK/small.pb" --addr "$ADDR" --json >"$WORK/small.json"
grep -q '"verdict": "VERDICT_PASS"' "$WORK/small.json" || fail "audit --json"

step "watch --verdict DRIFT sees drifting audits only"
timeout 60 "$CLI" watch --addr "$ADDR" --verdict DRIFT --count 2 --json \
  --duration 50s >"$WORK/watch.jsonl" 2>"$WORK/watch.err" &
watch_pid=$!
# The watcher connects asynchronously: keep auditing (PASS and DRIFT) until
# it has seen two DRIFT results, at most 40 rounds.
for _ in $(seq 1 40); do
  kill -0 "$watch_pid" 2>/dev/null || break
  timeout 60 "$CLI" audit "$WORK/small.pb" --addr "$ADDR" >/dev/null || true
  timeout 60 "$CLI" audit "$WORK/drift.pb" --addr "$ADDR" >/dev/null || true
done
wait "$watch_pid" || fail "watch: $(cat "$WORK/watch.err")"
[[ $(wc -l <"$WORK/watch.jsonl") == 2 ]] || fail "watch printed $(wc -l <"$WORK/watch.jsonl") lines"
grep -c '"verdict":"VERDICT_DRIFT"' "$WORK/watch.jsonl" | grep -qx 2 ||
  fail "watch output is not two DRIFT results: $(cat "$WORK/watch.jsonl" | cut -c1-300)"

step "bench: closed and open loop"
timeout 60 "$CLI" bench "$WORK/small.pb" --addr "$ADDR" --concurrency 2 \
  --warmup 0s --duration 1s --json >"$WORK/bench_closed.json" ||
  fail "closed-loop bench failed: $(cat "$WORK/bench_closed.json")"
# Open loop at 20/s for 2 s: 40 audits are due, whatever the latency.
timeout 60 "$CLI" bench "$WORK/small.pb" --addr "$ADDR" --concurrency 4 \
  --rate 20 --warmup 0s --duration 2s --json >"$WORK/bench_open.json" ||
  fail "open-loop bench failed: $(cat "$WORK/bench_open.json")"
grep -q '"rate": 20.000' "$WORK/bench_open.json" ||
  fail "open-loop bench did not report its rate: $(cat "$WORK/bench_open.json")"
audits=$(sed -n 's/.*"audits": \([0-9]*\).*/\1/p' "$WORK/bench_open.json")
[[ "$audits" -ge 38 && "$audits" -le 41 ]] ||
  fail "open loop at 20/s for 2 s made $audits audits, not ~40"

step "watch (text) prints one line per result with the reason that fired"
timeout 60 "$CLI" watch --addr "$ADDR" --count 1 --verdict DRIFT \
  --duration 50s >"$WORK/watch.txt" 2>"$WORK/watch_text.err" &
watch_pid=$!
for _ in $(seq 1 40); do
  kill -0 "$watch_pid" 2>/dev/null || break
  timeout 60 "$CLI" audit "$WORK/drift.pb" --addr "$ADDR" >/dev/null || true
done
wait "$watch_pid" || fail "watch: $(cat "$WORK/watch_text.err")"
[[ $(wc -l <"$WORK/watch.txt") == 1 ]] || fail "watch printed $(wc -l <"$WORK/watch.txt") lines"
# e.g. "a... DONE DRIFT model=llama3-8b layer=0: E-R out: 37 of 8192 values
# over the tolerance 5.3e-02, the largest 3.6e+00 at row 0, query 0, head 18
# (kv head 4), dim 7; also fired: E-R lse, ..."
grep -Eq '^[a-z0-9]+ DONE DRIFT model=llama3-8b layer=[0-9]+: E-R (out|lse|logprob): [0-9]+ of [0-9]+ (values|tokens) over the tolerance .* at row [0-9]+, query [0-9]+' \
  "$WORK/watch.txt" || fail "watch line does not say what fired where: $(cat "$WORK/watch.txt")"

step "metrics: drift histograms moved, promtool check metrics passes"
scrape >"$WORK/metrics.txt" || fail "scrape"
er_count=$(sed -n 's/^attnaudit_drift_out_max_abs_count{comparison="engine_vs_reference",layer="3",model="qwen3-8b"} \([0-9.e+]*\)$/\1/p' "$WORK/metrics.txt")
[[ -n "$er_count" ]] || fail "no engine_vs_reference out histogram for qwen3-8b/3"
awk -v c="$er_count" 'BEGIN { exit !(c >= 2) }' || fail "histogram count $er_count < 2"
grep -q '^attnaudit_audits_total{overridden="false",verdict="DRIFT"} [1-9]' "$WORK/metrics.txt" ||
  fail "DRIFT verdict counter did not move"
grep -q '^attnaudit_received_bytes_total [1-9]' "$WORK/metrics.txt" ||
  fail "received bytes did not move"
if [[ -n "$PROMTOOL" ]]; then
  "$PROMTOOL" check metrics <"$WORK/metrics.txt" || fail "promtool check metrics"
else
  echo "promtool not found; lint skipped"
fi

step "submit jobs, SIGKILL the server mid-way, restart, get every result once"
# Submit is unary: the jobs stay under the unary limit.
timeout 60 "$CLI" synth --preset llama3-8b --batch 2 --context 1024 \
  -o "$WORK/job.pb" 2>/dev/null
for i in 1 2 3 4 5 6; do cp "$WORK/job.pb" "$WORK/job$i.pb"; done
: >"$WORK/acked.txt"
pids=()
for pair in "1 2" "3 4" "5 6"; do
  set -- $pair
  timeout 120 "$CLI" submit "$WORK/job$1.pb" "$WORK/job$2.pb" --addr "$ADDR" \
    >>"$WORK/acked.txt" 2>/dev/null &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || fail "submit failed before the kill"; done
kill -KILL "$SERVER_PID"
wait "$SERVER_PID" 2>/dev/null || true
SERVER_PID=""
acked=$(awk '{print $2}' "$WORK/acked.txt" | sort -u)
[[ $(echo "$acked" | wc -l) == 6 ]] || fail "expected 6 acknowledged jobs"
pending=$(ls "$WORK/data/spool" | grep -c '\.job$' || true)
echo "spool entries left by SIGKILL: $pending"
# With the server down, get --wait keeps trying until its deadline (a
# restart is waited out), then reports UNAVAILABLE.
first=$(echo "$acked" | head -1)
t0=$(date +%s%N)
set +e
timeout 30 "$CLI" get "$first" --addr "$ADDR" --wait 1s >"$WORK/get.down" 2>&1
rc=$?
set -e
waited_ms=$(( ($(date +%s%N) - t0) / 1000000 ))
[[ $rc == 2 ]] || fail "get with the server down: exit $rc, want 2"
grep -q UNAVAILABLE "$WORK/get.down" || fail "get with the server down: $(cat "$WORK/get.down")"
(( waited_ms >= 900 )) || fail "get --wait 1s gave up after $waited_ms ms"

start_server "$WORK/server2.log" --cpu-workers 1
for id in $acked; do
  set +e
  timeout 120 "$CLI" get "$id" --addr "$ADDR" --wait 90s >"$WORK/get.$id" 2>&1
  rc=$?
  set -e
  [[ $rc == 0 ]] || fail "get $id: exit $rc: $(head -3 "$WORK/get.$id")"
  grep -q "^job $id: DONE" "$WORK/get.$id" || fail "get $id: not DONE"
  grep -q '^verdict: PASS' "$WORK/get.$id" || fail "get $id: no report"
done
# Exactly once: every job the restarted server re-queued from the spool
# completed once (no more, no fewer), nothing is left in the spool, and a
# further restart re-runs nothing (checked below).
ls "$WORK/data/spool" | grep -q '\.job$' && fail "spool not empty after all results"
requeued=$(sed -n 's/.*msg="spool resumed" spooled=[0-9]* requeued=\([0-9]*\).*/\1/p' "$WORK/server2.log")
[[ -n "$requeued" ]] || fail "no resume line"
[[ $requeued -le $pending ]] || fail "requeued $requeued > spooled $pending"
scrape >"$WORK/metrics2.txt" || fail "scrape after restart"
completed=$(sed -n 's/^attnaudit_jobs_completed_total{class="sampled",outcome="ok"} \([0-9]*\)$/\1/p' "$WORK/metrics2.txt")
[[ "$completed" == "$requeued" ]] ||
  fail "restarted server completed $completed sampled jobs, re-queued $requeued"
echo "re-queued and completed after the restart: $requeued"

step "SIGTERM drains and exits 0"
kill -TERM "$SERVER_PID"
set +e
timeout 30 tail --pid="$SERVER_PID" -f /dev/null
wait "$SERVER_PID"
rc=$?
set -e
SERVER_PID=""
[[ $rc == 0 ]] || fail "server exit code $rc after SIGTERM"
grep -q 'msg="attnaudit-server stopped"' "$WORK/server2.log" || fail "no stop line"

start_server "$WORK/server3.log" --cpu-workers 1
for _ in $(seq 1 100); do
  grep -q 'msg="spool resumed"' "$WORK/server3.log" && break
  sleep 0.05
done
grep -q 'msg="spool resumed" spooled=0 requeued=0' "$WORK/server3.log" ||
  fail "a third start found work to redo: $(grep 'spool resumed' "$WORK/server3.log")"
kill -TERM "$SERVER_PID"
wait "$SERVER_PID" || fail "third server exit"
SERVER_PID=""

if command -v openssl >/dev/null; then
  step "mTLS and bearer token"
  T="$WORK/tls"
  mkdir -p "$T"
  (
    cd "$T"
    openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=e2e-ca" \
      -keyout ca.key -out ca.pem
    for who in server client; do
      openssl req -newkey rsa:2048 -nodes -subj "/CN=$who" \
        -keyout $who.key -out $who.csr
      printf "subjectAltName=DNS:localhost,IP:127.0.0.1\n" >$who.ext
      openssl x509 -req -in $who.csr -CA ca.pem -CAkey ca.key \
        -CAcreateserial -days 2 -extfile $who.ext -out $who.pem
    done
    echo "e2e-token-$RANDOM$RANDOM" >token
  ) >/dev/null 2>&1 || fail "openssl could not make test certificates"
  start_server "$WORK/server4.log" --tls-cert "$T/server.pem" \
    --tls-key "$T/server.key" --tls-client-ca "$T/ca.pem" \
    --auth-token-file "$T/token"
  grep -q 'tls=mutual auth=bearer' "$WORK/server4.log" || fail "tls/auth line"
  grep -q "$(cat "$T/token")" "$WORK/server4.log" && fail "token in the log"
  tls=(--addr "$ADDR" --tls-ca "$T/ca.pem" --tls-server-name localhost)
  timeout 30 "$CLI" audit "$WORK/small.pb" "${tls[@]}" --tls-cert "$T/client.pem" \
    --tls-key "$T/client.key" --auth-token-file "$T/token" >/dev/null ||
    fail "audit over mTLS with the token"
  set +e
  timeout 30 "$CLI" caps "${tls[@]}" --tls-cert "$T/client.pem" \
    --tls-key "$T/client.key" --timeout 10s 2>"$WORK/notoken.err" >/dev/null
  no_token=$?
  timeout 30 "$CLI" caps "${tls[@]}" --auth-token-file "$T/token" \
    --timeout 5s 2>"$WORK/nocert.err" >/dev/null
  no_cert=$?
  timeout 30 "$CLI" caps --addr "$ADDR" --timeout 5s 2>/dev/null >/dev/null
  plaintext=$?
  set -e
  [[ $no_token == 2 ]] && grep -q UNAUTHENTICATED "$WORK/notoken.err" ||
    fail "a call without the token must be UNAUTHENTICATED"
  [[ $no_cert == 2 ]] || fail "a client without a certificate must fail"
  [[ $plaintext == 2 ]] || fail "a plaintext client must fail"
  kill -TERM "$SERVER_PID"
  wait "$SERVER_PID" || fail "TLS server exit"
  SERVER_PID=""
fi

# A co-located fleet may dial a Unix socket: the log names it as clients
# dial it (not a port), and an audit over it matches the offline check.
step "Unix socket listener"
sock="$WORK/attnaudit.sock"
"$SERVER_BIN" --listen "unix:$sock" --metrics-listen 127.0.0.1:0 \
  --data-dir "$WORK/data-unix" --accept-memfd-snapshots 2>"$WORK/server5.log" &
SERVER_PID=$!
for _ in $(seq 1 200); do
  grep -q 'msg="grpc listening"' "$WORK/server5.log" && break
  sleep 0.05
done
grep -q "msg=\"grpc listening\" addr=unix:$sock " "$WORK/server5.log" ||
  fail "the Unix socket's listening line"
timeout 30 "$CLI" audit "$WORK/small.pb" --addr "unix:$sock" >"$WORK/small.unix" ||
  fail "audit over the Unix socket"
diff <(strip_timings <"$WORK/small.check") <(strip_timings <"$WORK/small.unix") ||
  fail "the Unix socket's report differs from the offline check"
# The snapshot in shared memory (a sealed memfd the server reads in place).
timeout 30 "$CLI" audit "$WORK/big.pb" --addr "unix:$sock" --memfd \
  >"$WORK/big.memfd" || fail "audit --memfd"
diff <(strip_timings <"$WORK/big.check") <(strip_timings <"$WORK/big.memfd") ||
  fail "the memfd audit's report differs from the offline check"
kill -TERM "$SERVER_PID"
wait "$SERVER_PID" || fail "Unix socket server exit"
SERVER_PID=""
echo "PASS"
