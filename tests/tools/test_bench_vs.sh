#!/usr/bin/env bash
# `braid bench --vs` on the host backend: library A is the build's libnccl.so.2 and B a copy of it at another
# path, so that two instances of the library live in one process. Runs 2 and 4 ranks (one process per rank)
# and 3 ranks in one process (--single), with checks; every #wrong column must be 0, the JSON file must parse
# and hold the expected entries (json_check.py), and the PNG must be valid (png_check.py).
# Run by ctest as: bash test_bench_vs.sh <build-dir>.
set -u
build=${1:?usage: test_bench_vs.sh <build-dir>}
here=$(cd "$(dirname "$0")" && pwd)
braid="$build/bin/braid"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0

fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

cp "$build/lib/libnccl.so.2" "$tmp/libnccl.so.2" || { echo "cannot copy the library"; exit 1; }

# Checks a --vs table in $tmp/out: rows of 14 columns, both #wrong columns 0, and the closing line.
check_vs_table() {
  local rows bad
  rows=$(awk '!/^#/ && NF == 14' "$tmp/out" | wc -l)
  bad=$(awk '!/^#/ && NF == 14 && ($13 != "0" || $14 != "0")' "$tmp/out")
  [ "$rows" -gt 0 ] || fail "$1: no result rows"
  [ -z "$bad" ] || { fail "$1: wrong values"; echo "$bad" | head -n 10; }
  grep -q '^# Out of bounds values : 0 OK$' "$tmp/out" || fail "$1: no '# Out of bounds values : 0 OK' line"
  grep -q "^# B: $tmp/libnccl.so.2, NCCL version" "$tmp/out" || fail "$1: the header does not name library B"
}

# vs_run NAME NRANKS EXTRA-ARGS...: runs a comparison of all_reduce, all_gather, broadcast and sendrecv.
vs_run() {
  local name=$1 nranks=$2
  shift 2
  rm -f "$tmp/r.json" "$tmp/r.png"
  timeout 300 "$braid" bench --vs "$tmp/libnccl.so.2" -g "$nranks" -b 8 -e 256K -f 8 -n 3 --batch 2 -w 1 -c 1 \
    --json "$tmp/r.json" --png "$tmp/r.png" "$@" all_reduce all_gather broadcast sendrecv >"$tmp/out" 2>&1
  local status=$?
  if [ "$status" -ne 0 ]; then
    fail "$name exited with status $status"
    tail -n 20 "$tmp/out"
    return
  fi
  check_vs_table "$name"
  python3 "$here/json_check.py" "$tmp/r.json" 2 "$nranks" all_reduce all_gather broadcast sendrecv ||
    fail "$name: JSON"
  python3 "$here/png_check.py" "$tmp/r.png" 1000 1000 || fail "$name: PNG"
}

vs_run "2 ranks" 2
vs_run "4 ranks, int8 all ops" 4 -d int8 -o all
vs_run "3 ranks in one process" 3 --single

# One library: the nccl-tests table, and the JSON with one figure per row and no ratios.
if timeout 300 "$braid" bench -g 2 -b 64 -e 4K -f 8 -n 2 --json "$tmp/one.json" --png "$tmp/one.png" \
  reduce_scatter >"$tmp/out" 2>&1; then
  python3 "$here/json_check.py" "$tmp/one.json" 1 2 reduce_scatter || fail "one library: JSON"
  python3 "$here/png_check.py" "$tmp/one.png" || fail "one library: PNG"
else
  fail "one library: exit status"
  tail -n 20 "$tmp/out"
fi

# Refusals: graphs on the host backend, a --vs library that cannot be loaded.
"$braid" bench --device host -G >/dev/null 2>&1
[ $? -eq 2 ] || fail "--device host -G was not refused"
"$braid" bench -g 2 --vs "$tmp/missing.so" all_reduce >/dev/null 2>&1
[ $? -eq 1 ] || fail "a missing --vs library was not refused"

if [ "$failures" -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all bench --vs checks passed"
