# Functions of the GPU check (scripts/gpu_check.sh): reading nccl-tests' logs and writing the summary. Kept
# apart from the script so that tests/tools/test_gpu_check.sh can check them on sample logs without a GPU.
#
# nccl-tests prints one row per size (and type and operation with -d all -o all), 13 columns:
#   size count type redop root | time algbw busbw #wrong (out of place) | time algbw busbw #wrong (in place)
# #wrong is printed with %g, so a large count can read 1.2e+06. A collective without an operation
# (hypercube) leaves the redop column blank: 12 columns, read as if it were there.

# The data rows of a log, as "size busbw_out wrong_out busbw_in wrong_in".
nt_rows() {
  awk '!/^#/ && $1 ~ /^[0-9]+$/ && $2 ~ /^[0-9]+$/ {
         if (NF == 13) print $1, $8, $9, $12, $13; else if (NF == 12) print $1, $7, $8, $11, $12 }' "$1"
}

# The sum of every #wrong column of a log (0 when there is no table).
nt_wrong() {
  nt_rows "$1" | awk '{ for (i = 3; i <= 5; i += 2) if ($i ~ /^[0-9.eE+]+$/) w += $i } END { printf "%d\n", w }'
}

# "bytes busbw" of the largest size in a log (out of place), or nothing when there is no table.
nt_largest() {
  nt_rows "$1" | awk '$1 + 0 >= max { max = $1 + 0; bw = $2 } END { if (NR) print max, bw }'
}

# The verdict on one run: "pass" or "FAIL: <why>", from its exit status and its log. A run that crashed, timed
# out, printed no table, counted wrong values or reported out-of-bounds values failed.
nt_verdict() {
  local status=$1 log=$2 rows wrong why
  rows=$(nt_rows "$log" | wc -l)
  wrong=$(nt_wrong "$log")
  if [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then
    why="timed out"
  elif [ "$status" -ne 0 ]; then
    why="exit status $status"
  elif [ "$rows" -eq 0 ]; then
    why="no results table"
  fi
  if [ "$wrong" -gt 0 ]; then
    why="${why:+$why, }$wrong wrong values"
  elif [ -z "${why:-}" ] && ! grep -Eq '^# *Out of bounds values *: 0 OK' "$log"; then
    why="out-of-bounds values reported"
  fi
  if [ -n "${why:-}" ]; then
    local first
    first=$(grep -m1 -E 'NCCL (failure|WARN)|Test failure|[Ee]rror|Segmentation|Aborted' "$log" | cut -c1-160 |
            tr '\t|' '  ')
    echo "FAIL: $why${first:+ ($first)}"
  else
    echo "pass"
  fi
}

# The verdict on one GPU test binary from its exit status.
gt_verdict() {
  case $1 in
    0) echo pass ;;
    77) echo skipped ;;
    124 | 137) echo "FAIL: timed out" ;;
    *) echo "FAIL: exit status $1" ;;
  esac
}

# Writes summary.md from the result tables (tab-separated, written by the check):
#   GPU tests:  lib test verdict seconds detail
#   nccl-tests: lib mode binary verdict wrong status seconds largest_bytes busbw
# $1 GPU tests table, $2 nccl-tests table, $3 a header paragraph.
write_summary() {
  local gtests=$1 results=$2 header=$3
  printf '# GPU check\n\n%s\n\n' "$header"

  printf '## Project GPU tests (tests/gpu)\n\n| test | Braid | reference NCCL |\n|---|---|---|\n'
  awk -F'\t' '
    !($2 in seen) { seen[$2] = 1; order[++n] = $2 }
    { cell[$1, $2] = $3 ($4 != "" ? ", " $4 " s" : "") }
    END { for (i = 1; i <= n; i++) {
            t = order[i]; b = cell["braid", t]; r = cell["nccl", t]
            printf "| %s | %s | %s |\n", t, (b == "" ? "not run" : b), (r == "" ? "not run" : r) } }' "$gtests"
  if awk -F'\t' '$3 ~ /^FAIL/ && $5 != "" { found = 1 } END { exit !found }' "$gtests"; then
    printf '\nFirst failure reported by each failing test:\n\n'
    awk -F'\t' '$3 ~ /^FAIL/ && $5 != "" { printf "- %s, %s: `%s`\n", ($1 == "braid" ? "Braid" : "NCCL"), $2, $5 }' "$gtests"
  fi

  printf '\n## nccl-tests: correctness (binary x mode)\n\n| binary | mode | NCCL | Braid |\n|---|---|---|---|\n'
  awk -F'\t' '
    !(($3, $2) in seen) { seen[$3, $2] = 1; key[++n] = $3 SUBSEP $2 }
    { cell[$1, $3, $2] = $4 }
    END { for (i = 1; i <= n; i++) {
            split(key[i], k, SUBSEP)
            r = cell["nccl", k[1], k[2]]; b = cell["braid", k[1], k[2]]
            printf "| %s | %s | %s | %s |\n", k[1], k[2], (r == "" ? "not run" : r), (b == "" ? "not run" : b) } }' \
    "$results"
  printf '\n'
  awk -F'\t' '{ libs[$1] = 1; if ($4 ~ /^skipped/) skipped[$1]++; else runs[$1]++; if ($4 == "pass") pass[$1]++ }
    END { for (l in libs)
            printf "%s: %d of %d runs pass%s.\n", (l == "braid" ? "Braid" : "NCCL"), pass[l], runs[l],
                   (skipped[l] ? sprintf(" (%d more skipped for lack of time)", skipped[l]) : "") }' \
    "$results" | sort

  # Braid's figure is taken at NCCL's largest size only: a run that stopped early has no figure there.
  printf '\n## nccl-tests: bus bandwidth at the largest size, one process per GPU (out of place)\n\n'
  printf '| binary | size | NCCL busbw (GB/s) | Braid busbw (GB/s) | Braid / NCCL |\n|---|---|---|---|---|\n'
  awk -F'\t' '
    function human(b, i) { i = 1; while (b >= 1024 && b % 1024 == 0 && i < 5) { b /= 1024; i++ }
                           return sprintf("%d%s", b, substr("BKMGT", i, 1)) }
    $2 == "procs" && !($3 in seen) { seen[$3] = 1; order[++n] = $3 }
    $2 == "procs" { size[$1, $3] = $8; bw[$1, $3] = $9; ok[$1, $3] = ($4 == "pass") }
    END { for (i = 1; i <= n; i++) {
            b = order[i]; s = size["nccl", b]; r = bw["nccl", b]; m = bw["braid", b]
            if (s == "") { printf "| %s | - | - | %s | - |\n", b, (m == "" ? "-" : m); continue }
            if (size["braid", b] != s) m = (size["braid", b] == "" ? "-" : "- (its largest size: " human(size["braid", b]) ")")
            ratio = (m ~ /^[0-9.]+$/ && r + 0 > 0) ? sprintf("%.2f", m / r) : "-"
            if (m ~ /^[0-9.]+$/ && !ok["braid", b]) m = m " (the run failed)"
            if (!ok["nccl", b]) r = r " (the run failed)"
            printf "| %s | %s | %s | %s | %s |\n", b, human(s), r, m, ratio } }' "$results"
}
