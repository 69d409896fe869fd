#!/usr/bin/env bash
# Acceptance test of the offline CLI (issue 2, "Done when"): a clean synth of
# every preset PASSes, every --fault DRIFTs (exit 1), a corrupt or truncated
# file exits 2 with a message naming what is wrong, and `check --json` emits
# proto3 JSON. Usage: cli_acceptance_test.sh PATH/TO/attnaudit
set -u
cli=${1:?usage: $0 PATH/TO/attnaudit}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
passed=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
ok() { passed=$((passed + 1)); }

expect_exit() {  # expected_code description command...
  local want=$1 what=$2; shift 2
  "$@" >"$work/out.txt" 2>"$work/err.txt"
  local got=$?
  if [[ $got -ne $want ]]; then
    fail "$what: exit $got, want $want"; sed 's/^/    /' "$work/err.txt" | head -5
    return 1
  fi
  ok
}

# Every preset, clean, small: PASS.
for preset in llama3-8b qwen3-8b gemma2-9b gpt-oss-20b glm4-9b phi4-mini; do
  expect_exit 0 "synth $preset" "$cli" synth --preset "$preset" --batch 2 \
    --context 300 --permute-pages --seed 3 -o "$work/$preset.pb" || continue
  expect_exit 0 "check clean $preset" "$cli" check "$work/$preset.pb"
  grep -q "verdict: PASS" "$work/out.txt" || fail "check $preset: no PASS line"
done

# Few-query, fp8 and prefix variants stay clean.
expect_exit 0 "synth fp8 prefix Sq=3" "$cli" synth --preset llama3-8b --batch 2 \
  --context 200 --queries 3 --kv-dtype fp8_e4m3 --prefix 64 -o "$work/v.pb" &&
  expect_exit 0 "check fp8 prefix Sq=3" "$cli" check "$work/v.pb"

# Every fault: DRIFT.
for fault in stale-page swapped-pages rope-offset k-rope-twice lse-base2 \
             wrong-scale gqa-mapping drop-block fp8-scale; do
  expect_exit 0 "synth --fault $fault" "$cli" synth --preset qwen3-8b --batch 2 \
    --context 300 --permute-pages --fault "$fault" -o "$work/f.pb" || continue
  expect_exit 1 "check --fault $fault" "$cli" check "$work/f.pb"
  grep -q "verdict: DRIFT" "$work/out.txt" || fail "check $fault: no DRIFT line"
done

# JSON report.
expect_exit 0 "check --json" "$cli" check --json "$work/llama3-8b.pb"
grep -q '"verdict": "VERDICT_PASS"' "$work/out.txt" || fail "check --json: no verdict field"

# Context parallelism (issue 8): a clean sharded engine passes under both
# strategies and the report shows the per-rank table; check --json carries
# cp.ranks[*].rank and cp.ranks[*].verdict; a per-rank fault names its rank,
# a combine fault the combine.
expect_exit 0 "synth cp" "$cli" synth --preset llama3-8b --batch 2 --context 200 \
  --cp-world-size 3 --cp-sharding interleave --cp-interleave 3 -o "$work/cp.pb"
for strategy in ring partials; do
  expect_exit 0 "check cp $strategy" "$cli" check --cp-strategy "$strategy" "$work/cp.pb"
  grep -q "context parallelism: W=3 interleave I=3, strategy $strategy" "$work/out.txt" ||
    fail "check cp $strategy: no CP line"
  grep -Eq "^  2 +[0-9]+ +[0-9]+ PASS" "$work/out.txt" || fail "check cp $strategy: no row for rank 2"
done
expect_exit 0 "check --json cp" "$cli" check --json "$work/cp.pb"
ranks=$(tr -d ' \n' <"$work/out.txt" | grep -o '"rank":"[0-9]*","verdict":"VERDICT_PASS"' | wc -l)
[[ $ranks -eq 3 ]] || fail "check --json cp: $ranks of 3 cp.ranks entries with rank and verdict"
expect_exit 0 "synth cp lse-base2-rank" "$cli" synth --preset qwen3-8b --batch 2 --context 200 \
  --cp-world-size 4 --cp-sharding page --cp-fault lse-base2-rank --cp-fault-rank 1 -o "$work/cpf.pb"
expect_exit 1 "check cp lse-base2-rank" "$cli" check "$work/cpf.pb"
grep -Eq "^  1 +[0-9]+ +[0-9]+ DRIFT" "$work/out.txt" || fail "lse-base2-rank: rank 1 not DRIFT"
grep -q "combine (engine vs merge of its partials): PASS" "$work/out.txt" ||
  fail "lse-base2-rank: the combine is blamed"
expect_exit 0 "synth cp drop-shard" "$cli" synth --preset qwen3-8b --batch 2 --context 200 \
  --cp-world-size 4 --cp-sharding owners --cp-fault drop-shard -o "$work/cpd.pb"
expect_exit 1 "check cp drop-shard" "$cli" check --json "$work/cpd.pb"
tr -d ' \n' <"$work/out.txt" | grep -q '"combine":{"verdict":"VERDICT_DRIFT"' ||
  fail "drop-shard: cp.combine is not DRIFT"
expect_exit 2 "unknown cp fault" "$cli" synth --preset llama3-8b --cp-world-size 2 \
  --cp-fault nope -o "$work/x.pb"
expect_exit 2 "bad cp strategy" "$cli" check --cp-strategy spiral "$work/cp.pb"

# inspect.
expect_exit 0 "inspect" "$cli" inspect "$work/llama3-8b.pb"
grep -q "k_pages" "$work/out.txt" || fail "inspect: no k_pages line"

# presets: the engine presets table, as text and as JSON.
expect_exit 0 "presets" "$cli" presets
grep -q "^vllm-cpu .*cos_sin" "$work/out.txt" || fail "presets: no vllm-cpu row"
expect_exit 0 "presets --json" "$cli" presets --json
python3 -c 'import json, sys; json.load(open(sys.argv[1]))["engine_presets"]["hf-eager"]' \
  "$work/out.txt" || fail "presets --json: not the presets as JSON"

# pair: a snapshot paired with itself is consistent (exit 0); a rollout whose
# kernel reads a stale page is rollout-drift (exit 1); --json is the
# PairReport; a missing file exits 2 naming the side.
expect_exit 0 "pair itself" "$cli" pair "$work/qwen3-8b.pb" "$work/qwen3-8b.pb" &&
  { grep -q " consistent " "$work/out.txt" || fail "pair itself: no consistent row"; }
expect_exit 0 "synth stale rollout" "$cli" synth --preset qwen3-8b --batch 2 \
  --context 300 --permute-pages --seed 3 --fault stale-page -o "$work/stale.pb" &&
  expect_exit 1 "pair stale rollout" "$cli" pair --json "$work/stale.pb" "$work/qwen3-8b.pb" &&
  { python3 -c 'import json, sys; r = json.load(open(sys.argv[1]))
assert r["verdict"] == "rollout-drift" and len(r["rows"]) == 2, r' "$work/out.txt" ||
    fail "pair --json: not rollout-drift over two rows"; }
expect_exit 2 "pair missing file" "$cli" pair "$work/nope.pb" "$work/qwen3-8b.pb" &&
  { grep -q "rollout.*nope.pb" "$work/err.txt" || fail "pair: the missing side not named"; }

# Truncated, corrupt, missing files: exit 2 with a message naming the problem.
size=$(stat -c %s "$work/llama3-8b.pb")
head -c $((size / 2)) "$work/llama3-8b.pb" >"$work/truncated.pb"
expect_exit 2 "check truncated" "$cli" check "$work/truncated.pb"
grep -q "truncated.pb" "$work/err.txt" || fail "truncated: message does not name the file"
printf 'this is not a snapshot' >"$work/corrupt.pb"
expect_exit 2 "check corrupt" "$cli" check "$work/corrupt.pb"
grep -qi "corrupt\|not a valid\|missing" "$work/err.txt" || fail "corrupt: unclear message"
expect_exit 2 "check missing" "$cli" check "$work/does-not-exist.pb"
expect_exit 2 "unknown preset" "$cli" synth --preset nope -o "$work/x.pb"
expect_exit 2 "unknown fault" "$cli" synth --preset llama3-8b --fault nope -o "$work/x.pb"
expect_exit 2 "unknown flag" "$cli" check --bogus "$work/llama3-8b.pb"

# Usage errors: exit 2 and a message that says what was wrong.
expect_usage_error() {  # description expected-text command...
  local what=$1 text=$2; shift 2
  expect_exit 2 "$what" "$@" || return
  grep -qF -- "$text" "$work/err.txt" ||
    { fail "$what: stderr does not say '$text'"; sed 's/^/    /' "$work/err.txt" | head -3; }
}
pb="$work/llama3-8b.pb"
expect_usage_error "two files" "not expected: $pb" "$cli" check "$pb" "$pb"
expect_usage_error "no file" "FILE is required" "$cli" check
expect_usage_error "bad integer" "--threads" "$cli" check --threads many "$pb"
expect_usage_error "negative tolerance" "--out-tol" "$cli" check --out-tol -1 "$pb"
expect_usage_error "no output" "--output" "$cli" synth --preset llama3-8b
expect_usage_error "no command" "subcommand is required" "$cli"
expect_usage_error "unknown command" "nosuch" "$cli" nosuch
expect_usage_error "unary and stream" "--stream" "$cli" audit --unary --stream "$pb"
expect_usage_error "bad duration" "--timeout" "$cli" caps --timeout soon
expect_usage_error "unknown flag without FILE" "--nope" "$cli" check --nope
expect_usage_error "extra argument to inspect" "not expected: $pb" "$cli" inspect "$pb" "$pb"
expect_usage_error "no JOB_ID" "JOB_ID is required" "$cli" get
expect_usage_error "no JOB_ID to cancel" "JOB_ID is required" "$cli" cancel
expect_usage_error "no FILE to submit" "FILE is required" "$cli" submit
expect_usage_error "no FILE to bench" "FILE is required" "$cli" bench
expect_usage_error "extra argument to watch" "not expected: extra" "$cli" watch extra
expect_usage_error "bad verdict" "--verdict" "$cli" watch --verdict MAYBE
expect_usage_error "bad priority" "--priority" "$cli" submit --priority urgent "$pb"
expect_usage_error "bad concurrency" "--concurrency" "$cli" bench --concurrency 0 "$pb"
expect_usage_error "zero timeout" "--timeout: must be positive" "$cli" caps --timeout 0
expect_usage_error "unknown top-level option" "unknown option '--bogus'" "$cli" --bogus
expect_usage_error "help for an unknown command" "unknown command 'nosuch'" "$cli" help nosuch
# --addr needs a port: without one gRPC would dial 443.
for cmd in caps "audit $pb" "submit $pb" "get j1" "watch" "cancel j1" "bench $pb"; do
  # shellcheck disable=SC2086
  expect_usage_error "--addr localhost ($cmd)" "'localhost' has no port" \
    "$cli" $cmd --addr localhost
done
expect_usage_error "--addr IPv6 unbracketed" "bracket an IPv6 host" "$cli" caps --addr ::1:50051
expect_usage_error "--addr bad port" "is not a number in 1..65535" "$cli" caps --addr host:99999
expect_exit 2 "--addr [::1]:1 is accepted (then fails to connect)" \
  "$cli" caps --addr "[::1]:1" --timeout 2 &&
  { grep -q "server \[::1\]:1: UNAVAILABLE" "$work/err.txt" ||
    fail "--addr [::1]:1: $(cat "$work/err.txt")"; }
# Local errors are worded as local: no status code, the file named.
for cmd in audit bench; do
  expect_exit 2 "$cmd of a missing file" "$cli" $cmd "$work/missing.pb" --addr 127.0.0.1:1
  grep -q "missing.pb: cannot open" "$work/err.txt" && ! grep -q "NOT_FOUND\|server" "$work/err.txt" ||
    fail "$cmd of a missing file reads as a server answer: $(cat "$work/err.txt")"
done
expect_exit 2 "submit of a missing file" "$cli" submit "$work/missing.pb" --addr 127.0.0.1:1
grep -q "missing.pb: cannot open" "$work/err.txt" && ! grep -q "NOT_FOUND" "$work/err.txt" ||
  fail "submit of a missing file reads as a server answer: $(cat "$work/err.txt")"
expect_exit 0 "--version" "$cli" --version &&
  { grep -q "^attnaudit [0-9]" "$work/out.txt" || fail "--version: $(cat "$work/out.txt")"; }
expect_exit 0 "help check" "$cli" help check &&
  { grep -q -- "--json" "$work/out.txt" || fail "help check: no --json"; }

# Enum values by name.
expect_exit 0 "inspect names enums" "$cli" inspect "$pb"
grep -q "scaling=llama3" "$work/out.txt" || fail "inspect: scaling not by name: $(grep rope: "$work/out.txt")"
grep -q "q=.*_rope k=.*_rope style=neox" "$work/out.txt" || fail "inspect: rope states not by name"

# The report names what fired, where in the engine's terms, and what the
# log-prob tolerance bounds.
expect_exit 0 "synth lse-base2" "$cli" synth --preset llama3-8b --batch 2 --context 300 \
  --fault lse-base2 -o "$work/lse.pb"
expect_exit 1 "check lse-base2" "$cli" check "$work/lse.pb"
report="$work/out.txt"
grep -q "^verdict: DRIFT (E-R lse, E-P lse)$" "$report" || fail "verdict line does not name what fired: $(head -1 "$report")"
grep -q "^E-R engine vs reference: DRIFT" "$report" || fail "no E-R comparison heading"
grep -q "^    lse: [0-9]* of [0-9]* values over the tolerance" "$report" || fail "no lse finding"
grep -q "^      at row [0-9]*, query 0, head [0-9]* (kv head [0-9]*): engine .*, reference " "$report" ||
  fail "lse finding without the engine location"
grep -q "^    out: within the tolerance" "$report" || fail "out not reported within tolerance"
grep -q "logprob tolerance (E-R .* nats): the most a selected-token" "$report" ||
  fail "no line saying what the log-prob tolerance bounds"
# The diagnosis names the bug; the generic "not localised" note is only for
# a DRIFT the diagnosis did not examine.
grep -q "^diagnosis: lse-base: engine LSE in base 2" "$report" ||
  fail "the diagnosis does not name lse-base: $(grep '^diagnosis' "$report")"
grep -q "^localisation:" "$report" && fail "a diagnosed DRIFT still says it is not localised"
expect_exit 0 "check PASS has no diagnosis" "$cli" check "$pb"
grep -q "^diagnosis:\|^localisation:" "$work/out.txt" && fail "a PASS report has a diagnosis or localisation section"

# One fingerprint name: the report names the definition the server's caps
# name (core/fingerprint/fingerprint.h kFingerprintVersion).
fp_version=$(sed -n 's/.*kFingerprintVersion\[\] = "\(.*\)";/\1/p' \
  "$(dirname "$0")/../../core/fingerprint/fingerprint.h")
expect_exit 0 "check --kv-fingerprint" "$cli" check --kv-fingerprint "$pb"
grep -q "^kv fingerprint: $fp_version [0-9a-f]\{64\}$" "$work/out.txt" ||
  fail "kv fingerprint line does not name $fp_version: $(grep fingerprint "$work/out.txt")"

expect_exit 0 "check --help" "$cli" check --help &&
  { grep -q -- "--json" "$work/out.txt" || fail "check --help: no --json"; }
expect_exit 0 "--help" "$cli" --help &&
  { grep -q "bench" "$work/out.txt" || fail "--help: no bench command"; }

echo "$passed passed, $failures failed"
[[ $failures -eq 0 ]]
