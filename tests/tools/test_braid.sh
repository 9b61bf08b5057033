#!/usr/bin/env bash
# The braid tool end to end: --version, info --params, and short bench sweeps whose results must all check
# out (every #wrong column 0, exit status 0). Run by ctest as: bash test_braid.sh <build-dir>.
set -u
build=${1:?usage: test_braid.sh <build-dir>}
braid="$build/bin/braid"
failures=0
out=$(mktemp)
trap 'rm -f "$out"' EXIT

fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

# Runs braid with the given arguments into $out; fails the case when it exits non-zero.
run() {
  timeout 300 "$braid" "$@" >"$out" 2>&1
  local status=$?
  if [ "$status" -ne 0 ]; then
    fail "braid $* exited with status $status"
    tail -n 20 "$out"
    return 1
  fi
}

# The benches measure the library beside braid; BRAID_TEST_BENCH_LIB names another one (any NCCL build).
bench() {
  run bench ${BRAID_TEST_BENCH_LIB:+--lib "$BRAID_TEST_BENCH_LIB"} "$@"
}

# Checks a bench table in $out: at least one row, every #wrong column 0 (or N/A), and the closing line.
check_table() {
  local rows bad
  rows=$(awk '!/^#/ && NF == 13' "$out" | wc -l)
  bad=$(awk '!/^#/ && NF == 13 && (($9 != "0" && $9 != "N/A") || ($13 != "0" && $13 != "N/A"))' "$out")
  [ "$rows" -gt 0 ] || fail "$1: no result rows"
  [ -z "$bad" ] || { fail "$1: wrong values"; echo "$bad" | head -n 20; }
  grep -q '^# Out of bounds values : 0 OK$' "$out" || fail "$1: no '# Out of bounds values : 0 OK' line"
}

run --version && { grep -qx 'braid [0-9.]* (NCCL API 2.28.9)' "$out" || fail "--version: $(cat "$out")"; }
# NCCL's banner is a string in the library, for `strings libnccl.so.2 | grep "NCCL version"`.
grep -qa 'NCCL version 2\.28\.9+braid\.[0-9]' "$build/lib/libnccl.so.2" || fail "no banner string in libnccl.so.2"

if run info --params; then
  for knob in NCCL_DEBUG BRAID_HOST_BUFFSIZE; do
    grep -q "^$knob " "$out" || fail "info --params does not list $knob"
  done
fi
run info && { grep -q '^Backend: ' "$out" || fail "info prints no backend"; }
# The architectures the kernels carry: cubins, then the PTX; none in a build without nvcc.
run info && { grep -qE '^Kernels: ((sm_[0-9]+[af]? )+compute_[0-9]+|none \(built without nvcc\).*)$' "$out" ||
  fail "info: no architectures: $(grep Kernels "$out")"; }

# Usage errors are refused with status 2.
"$braid" bench -d nosuchtype >/dev/null 2>&1
[ $? -eq 2 ] || fail "bench -d nosuchtype was not refused"
"$braid" bench nosuchcollective >/dev/null 2>&1
[ $? -eq 2 ] || fail "bench with an unknown collective was not refused"
run bench --list && { [ "$(wc -l <"$out")" -eq 9 ] || fail "bench --list does not list 9 collectives"; }

bench -b 8 -e 64K -f 4 -n 2 -w 1 -g 3 -c 1 && check_table "float sum sweep"
bench -b 8 -e 1K -f 8 -n 1 -w 0 -g 3 -c 1 -d all -o all && check_table "all types and ops"
bench -b 64 -e 4K -f 8 -n 1 -w 0 -g 5 -r 2 -d int8 -o all && check_table "5 ranks, root 2"

if [ "$failures" -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all braid checks passed"
