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
expect_usage_error "no file" "file is required" "$cli" check
expect_usage_error "bad integer" "--threads" "$cli" check --threads many "$pb"
expect_usage_error "negative tolerance" "--out-tol" "$cli" check --out-tol -1 "$pb"
expect_usage_error "no output" "--output" "$cli" synth --preset llama3-8b
expect_usage_error "no command" "subcommand is required" "$cli"
expect_usage_error "unknown command" "nosuch" "$cli" nosuch
expect_usage_error "unary and stream" "--stream" "$cli" audit --unary --stream "$pb"
expect_usage_error "bad duration" "--timeout" "$cli" caps --timeout soon
expect_exit 0 "check --help" "$cli" check --help &&
  { grep -q -- "--json" "$work/out.txt" || fail "check --help: no --json"; }
expect_exit 0 "--help" "$cli" --help &&
  { grep -q "bench" "$work/out.txt" || fail "--help: no bench command"; }

echo "$passed passed, $failures failed"
[[ $failures -eq 0 ]]
