#!/usr/bin/env bash
# The GPU check's reading of nccl-tests logs and its summary (scripts/gpu_check_lib.sh), on sample logs in
# nccl-tests' table format, since the check itself runs only on a machine with GPUs; and that the check script
# parses. Run by ctest as: bash test_gpu_check.sh <build-dir> (the build directory is not used).
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
. "$root/scripts/gpu_check_lib.sh"
failures=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

# expect WHAT GOT WANT
expect() {
  [ "$2" = "$3" ] || fail "$1: got '$2', expected '$3'"
}

bash -n "$root/scripts/gpu_check.sh" || fail "scripts/gpu_check.sh does not parse"

# A header as nccl-tests prints it, then rows; the table is the same for every binary.
table_head() {
  cat <<'EOF'
# Using devices
#  Rank  0 Group  0 Pid   4242 on       node device  0 [0000:19:00] NVIDIA H200
#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  (GB/s)
EOF
}

{
  table_head
  echo "           8             2     float     sum      -1    20.11    0.00    0.00       0    19.80    0.00    0.00       0"
  echo "     1048576        262144     float     sum      -1    31.50   33.29   33.29       0    30.90   33.93   33.93       0"
  echo "  1073741824     268435456     float     sum      -1   3702.0  290.04  290.04       0   3699.1  290.27  290.27       0"
  echo "# Out of bounds values : 0 OK"
  echo "# Avg bus bandwidth    : 107.78"
} >"$tmp/good.log"

# Wrong values, one count printed by %g in exponent form, and the footer that goes with them.
{
  table_head
  echo "node:123:456 [0] NCCL INFO a log line between rows"
  echo "           8             2     float     sum      -1    20.11    0.00    0.00       5    19.80    0.00    0.00       0"
  echo "  1073741824     268435456     float     sum      -1   7404.0  145.02  145.02       0   7390.1  145.29  145.29 1.2e+06"
  echo "# Out of bounds values : 2 FAILED"
} >"$tmp/wrong.log"

# A run that stopped partway: rows up to 256 MiB, then an error.
{
  table_head
  echo "           8             2     float     sum      -1    20.11    0.00    0.00       0    19.80    0.00    0.00       0"
  echo "   268435456      67108864     float     sum      -1    990.1  271.12  271.12       0    991.0  270.87  270.87       0"
  echo "node: Test NCCL failure common.cu:1234 'unhandled cuda error (run with NCCL_DEBUG=INFO for details)'"
} >"$tmp/stopped.log"

# No table at all, and a table without its footer.
{ table_head; echo "init failed"; } >"$tmp/empty.log"
head -n -2 "$tmp/good.log" >"$tmp/nofooter.log"

# A collective without an operation (hypercube) leaves the redop column blank.
{
  table_head
  echo "     2097152        262144     float              -1    21.41   48.97   48.97       0    15.96   65.70   65.70       3"
  echo "# Out of bounds values : 0 OK"
} >"$tmp/noop.log"
expect "wrong values, no redop column" "$(nt_wrong "$tmp/noop.log")" 3
expect "largest size, no redop column" "$(nt_largest "$tmp/noop.log")" "2097152 48.97"

expect "wrong values, good log" "$(nt_wrong "$tmp/good.log")" 0
expect "wrong values, wrong log" "$(nt_wrong "$tmp/wrong.log")" 1200005
expect "wrong values, no table" "$(nt_wrong "$tmp/empty.log")" 0
expect "rows of the good log" "$(nt_rows "$tmp/good.log" | wc -l)" 3
expect "largest size, good log" "$(nt_largest "$tmp/good.log")" "1073741824 290.04"
expect "largest size, stopped log" "$(nt_largest "$tmp/stopped.log")" "268435456 271.12"
expect "largest size, no table" "$(nt_largest "$tmp/empty.log")" ""

expect "verdict, good run" "$(nt_verdict 0 "$tmp/good.log")" pass
expect "verdict, wrong values" "$(nt_verdict 0 "$tmp/wrong.log")" "FAIL: 1200005 wrong values"
expect "verdict, time-out" "$(nt_verdict 124 "$tmp/good.log")" "FAIL: timed out"
expect "verdict, killed after a time-out" "$(nt_verdict 137 "$tmp/empty.log")" "FAIL: timed out"
expect "verdict, no table" "$(nt_verdict 0 "$tmp/empty.log")" "FAIL: no results table"
expect "verdict, no footer" "$(nt_verdict 0 "$tmp/nofooter.log")" "FAIL: out-of-bounds values reported"
case $(nt_verdict 1 "$tmp/stopped.log") in
  "FAIL: exit status 1 ("*"NCCL failure"*) ;;
  *) fail "verdict, stopped run: $(nt_verdict 1 "$tmp/stopped.log")" ;;
esac

expect "GPU test exit 0" "$(gt_verdict 0)" pass
expect "GPU test exit 77" "$(gt_verdict 77)" skipped
expect "GPU test exit 124" "$(gt_verdict 124)" "FAIL: timed out"
expect "GPU test exit 1" "$(gt_verdict 1)" "FAIL: exit status 1"

# The summary from result tables like the ones the check writes.
printf 'braid\ttest_cuda_coll\tpass\t61\t\n' >"$tmp/gt.tsv"
printf 'braid\ttest_cuda_abort\tFAIL: timed out\t60\tFAIL [pid 7]: timed out after 20 s: rank 0: abort\n' \
  >>"$tmp/gt.tsv"
printf 'nccl\ttest_cuda_coll\tpass\t40\t\n' >>"$tmp/gt.tsv"
{
  printf 'nccl\tprocs\tall_reduce_perf\tpass\t0\t0\t6\t1073741824\t290.04\n'
  printf 'braid\tprocs\tall_reduce_perf\tFAIL: 1200005 wrong values\t1200005\t0\t9\t1073741824\t145.02\n'
  printf 'nccl\tprocs\tbroadcast_perf\tpass\t0\t0\t5\t1073741824\t300.00\n'
  printf 'braid\tprocs\tbroadcast_perf\tFAIL: exit status 1\t0\t1\t4\t268435456\t271.12\n'
  printf 'nccl\tgraphs\tall_reduce_perf\tpass\t0\t0\t7\t134217728\t250.00\n'
  printf 'braid\tgraphs\tall_reduce_perf\tskipped: out of time\t0\t\t\t\t\n'
} >"$tmp/results.tsv"
write_summary "$tmp/gt.tsv" "$tmp/results.tsv" "A header." >"$tmp/summary.md"

# want LINE: the summary holds exactly this line.
want() {
  grep -qxF -- "$1" "$tmp/summary.md" || fail "summary lacks the line: $1"
}
want "| test_cuda_coll | pass, 61 s | pass, 40 s |"
want "| test_cuda_abort | FAIL: timed out, 60 s | not run |"
want '- Braid, test_cuda_abort: `FAIL [pid 7]: timed out after 20 s: rank 0: abort`'
want "| all_reduce_perf | procs | pass | FAIL: 1200005 wrong values |"
want "| broadcast_perf | procs | pass | FAIL: exit status 1 |"
want "| all_reduce_perf | graphs | pass | skipped: out of time |"
want "Braid: 0 of 2 runs pass (1 more skipped for lack of time)."
want "NCCL: 3 of 3 runs pass."
want "| all_reduce_perf | 1G | 290.04 | 145.02 (the run failed) | 0.50 |"
want "| broadcast_perf | 1G | 300.00 | - (its largest size: 256M) | - |"
if grep -q "graphs" <(sed -n '/bus bandwidth/,$p' "$tmp/summary.md"); then
  fail "the bandwidth table holds a mode other than one process per GPU"
fi

[ -n "${SHOW:-}" ] && cat "$tmp/summary.md"
if [ "$failures" -ne 0 ]; then
  echo "--- summary.md"
  cat "$tmp/summary.md"
  echo "$failures failure(s)"
  exit 1
fi
echo "all checks passed"
