#!/usr/bin/env bash
# scripts/gpu_sanitize.sh without a GPU: its repeats of a GPU test on the host backend (no sanitizer tool), its
# summary, and its exit status when the test passes and when it fails. Run by ctest as:
# bash test_gpu_sanitize.sh <build-dir>; skipped (77) where the build has no GPU tests.
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$1
[ -x "$build/bin/test_cuda_coll" ] || {
  echo "SKIP: $build has no test_cuda_coll (built only with the CUDA toolkit)"
  exit 77
}
failures=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

bash -n "$root/scripts/gpu_sanitize.sh" || fail "scripts/gpu_sanitize.sh does not parse"

# A passing case, twice: exit 0, a line per run, and the matched case in the logs.
match="AllReduce int8 op premulsum(device scalar) count 1000003 out-of-place"
BUILD=$build OUT=$tmp/pass TOOLS="" REPEAT=2 bash "$root/scripts/gpu_sanitize.sh" test_cuda_coll --host \
  --match "$match" procs_ce >"$tmp/pass.out" 2>&1
rc=$?
[ "$rc" -eq 0 ] || fail "a passing test: exit $rc ($(tail -3 "$tmp/pass.out"))"
[ "$(grep -c '^plain-[12]: exit 0, ' "$tmp/pass/summary.txt")" = 2 ] ||
  fail "a passing test: the summary lacks its two runs: $(cat "$tmp/pass/summary.txt")"
mkdir -p "$tmp/logs"
tar -xzf "$tmp/pass/logs.tgz" -C "$tmp/logs" || fail "logs.tgz does not unpack"
grep -q "matched: \[procs/ce\] $match" "$tmp/logs/logs/plain-1.log" 2>/dev/null ||
  fail "plain-1.log does not name the matched case"

# A failing one: exit 1, and the summary says why.
BUILD=$build OUT=$tmp/fail TOOLS="" REPEAT=1 bash "$root/scripts/gpu_sanitize.sh" test_cuda_coll --host \
  no_such_case >"$tmp/fail.out" 2>&1
rc=$?
[ "$rc" -eq 1 ] || fail "a failing test: exit $rc, expected 1"
grep -q '^plain-1: exit 1, ' "$tmp/fail/summary.txt" || fail "a failing test: $(cat "$tmp/fail/summary.txt")"
grep -q 'no such case' "$tmp/fail/summary.txt" || fail "a failing test: the summary does not say why"

[ "$failures" -eq 0 ] && echo "test_gpu_sanitize: all passed"
exit $((failures > 0))
