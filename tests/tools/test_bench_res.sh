#!/usr/bin/env bash
# `braid bench --resources`. On the host backend: one library and --vs a copy of it, every line of the report
# present, memory n/a, times measured, the JSON checked by json_check.py (values, ratios, the time per iteration
# against the host time of its calls), the refusals. Then, where the build has CUDA headers, on the stand-in
# CUDA driver (mock_cudrv.c, whose contexts hold BRAID_MOCK_CTX_MIB and whose allocations count in 2 MiB
# granules) with the stand-in library (fake_nccl.c, which allocates known amounts at init, at a communicator's
# first call and at its first in-place call): every memory figure must be exactly what the allocations make
# it, on the right GPU, with the bench's own buffers taken off; and a library that fails leaves the other's
# figures and an exit status of 1. Run by ctest as: bash test_bench_res.sh <build-dir>.
set -u
build=${1:?usage: test_bench_res.sh <build-dir>}
here=$(cd "$(dirname "$0")" && pwd)
braid="$build/bin/braid"
check() { python3 "$here/json_check.py" "$@"; }
mock="$build/tests/mock_cudrv"
fake="$build/tests/fake_nccl/libnccl.so.2"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
cp "$build/lib/libnccl.so.2" "$tmp/libnccl.so.2" || exit 1

fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

memory_lines=("device memory before init, MiB per GPU" "device memory after init, MiB per GPU"
  "bench's buffers and streams, MiB (taken off below)" "device memory after every collective, MiB per GPU"
  "  increase over before init, MiB per GPU" "device memory after the eager loop, MiB per GPU")
time_lines=("ncclCommInitAll, ms" "first all_reduce (1 MiB), ms" "host us per call (enqueue)"
  "us per iteration (8 B all_reduce, synchronised)")
floor_line="  floor: host us per empty kernel launch" # the GPU's, not a library's: n/a on the host, no ratio

# res_run NAME ARGS...: runs the bench with --resources into $tmp/out; it must exit 0.
res_run() {
  local name=$1
  shift
  rm -f "$tmp/r.json"
  timeout 300 "$braid" bench --resources --json "$tmp/r.json" "$@" >"$tmp/out" 2>&1
  local status=$?
  [ "$status" -eq 0 ] && return 0
  fail "$name exited with status $status"
  tail -n 20 "$tmp/out"
  return 1
}

# The fields of the report's line for a figure, after its text (one value per library, then the ratio),
# separated by single spaces.
fields() {
  grep -F -- "#  $1 " "$tmp/out" | head -n 1 | cut -c 54- | awk '{ $1 = $1; print }'
}

# check_lines NAME NLIBS MEMORY: every figure's line is there with NLIBS values (n/a for memory and the floor
# on the host, numbers otherwise) and, with two libraries, a ratio wherever the figure is the library's own.
check_lines() {
  local name=$1 nlibs=$2 memory=$3 line f values n want_ratio kind number='\([0-9][0-9.]* \)*'
  for line in "${memory_lines[@]}" "${time_lines[@]}"; do
    f=$(fields "$line")
    [ -n "$f" ] || { fail "$name: no line '$line'"; continue; }
    values=$(echo "$f" | awk -v n="$nlibs" '{ for (i = 1; i <= n; i++) printf "%s ", $i }')
    n=$(echo "$f" | awk '{ print NF }')
    want_ratio=0
    case "$line" in
    "device memory before init"* | "bench's"*) ;;
    *) [ "$nlibs" -gt 1 ] && want_ratio=1 ;;
    esac
    [ "$n" -eq $((nlibs + want_ratio)) ] || fail "$name: '$line' has $n fields: $f"
    kind=time
    for m in "${memory_lines[@]}"; do [ "$line" = "$m" ] && kind=$memory; done
    if [ "$kind" = host ]; then
      echo "$values" | grep -qx '\(n/a \)*' || fail "$name: '$line' is not n/a on the host: $f"
    else
      echo "$values" | grep -qx "$number" || fail "$name: '$line' is not a number: $f"
    fi
  done
  f=$(fields "$floor_line")
  if [ "$memory" = host ]; then
    [ "$f" = "$(printf 'n/a %.0s' $(seq "$nlibs") | sed 's/ $//')" ] || fail "$name: the floor reads '$f'"
  else
    echo "$f " | grep -qx "$number" && [ "$(echo "$f" | awk '{ print NF }')" -eq "$nlibs" ] ||
      fail "$name: the floor reads '$f'"
  fi
}

# The host backend: one library, then --vs a copy of it.
if res_run "host, one library" -g 2 --device host; then
  grep -q '^# resources: 2 ranks, one process, host backend, ' "$tmp/out" || fail "host: header"
  check_lines "host, one library" 1 host
  check --resources "$tmp/r.json" 1 2 host || fail "host, one library: JSON"
fi
if res_run "host, --vs" -g 3 --device host --vs "$tmp/libnccl.so.2"; then
  grep -q "^# B: $tmp/libnccl.so.2, NCCL version 22809" "$tmp/out" || fail "host --vs: the header lacks B"
  grep -q '^#  what .* A: 2.28.9 *B: 2.28.9 *B/A$' "$tmp/out" || fail "host --vs: column heads"
  check_lines "host, --vs" 2 host
  check --resources "$tmp/r.json" 2 3 host || fail "host, --vs: JSON"
fi

# Refusals: graphs, a PNG, collective names.
for args in "-G" "--png $tmp/x.png" "all_reduce"; do
  "$braid" bench --resources --device host -g 2 $args >/dev/null 2>&1
  [ $? -eq 2 ] || fail "--resources $args was not refused"
done

if [ ! -e "$mock/libcuda.so.1" ] || [ ! -e "$fake" ]; then
  echo "no stand-in driver or library (built without CUDA headers): the memory figures are not checked"
elif "$braid" info | grep -q '^Kernels: none'; then
  echo "no floor kernel (built without nvcc): the figures on the stand-in driver are not checked"
else
  export LD_LIBRARY_PATH="$mock${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export BRAID_MOCK_GPUS=4 BRAID_MOCK_CTX_MIB=300,299
  # Braid on its host backend (no device memory of its own) as A, the stand-in library as B. Per GPU, B
  # holds 8 + 2 r MiB after init, 6 more after its first call and 2 more after its first in-place call; the
  # bench's two 1 MiB buffers take a 2 MiB granule each. GPU 0 has the larger context (300 MiB), GPU 1 the
  # larger increase (309 + 8 = 317 after every collective, 18 over its 299): the maxima are per GPU.
  if BRAID_DEVICE=host res_run "stand-in driver, --vs the stand-in library" --device cuda -g 2 --vs "$fake"; then
    grep -q '^# resources: 2 ranks, one process, Mock GPU 0, ' "$tmp/out" || fail "stand-in: header"
    grep -q '^#  what .* A: 2.28.9 *B: 2.27.3 *B/A$' "$tmp/out" || fail "stand-in: column heads"
    check_lines "stand-in driver" 2 cuda
    [ "$(fields "  increase over before init, MiB per GPU")" = "0.0 18.0 n/a" ] ||
      fail "stand-in: the increase line reads '$(fields "  increase over before init, MiB per GPU")'"
    check --resources "$tmp/r.json" 2 2 cuda mem_before_init_mib=300,300 mem_after_init_mib=300,309 \
      mem_bench_mib=4,4 mem_after_all_mib=300,317 mem_increase_mib=0,18 mem_end_mib=300,317 ||
      fail "stand-in driver, --vs: JSON"
  fi
  # The stand-in library as A on three GPUs: 311 after init (GPU 2: 299 + 12), 319 after every collective,
  # an increase of 20; B/A of the increase is 0 (Braid holds no device memory on its host backend).
  if BRAID_DEVICE=host res_run "stand-in library as A" --device cuda -g 3 --lib "$fake" --vs "$tmp/libnccl.so.2"
  then
    [ "$(fields "  increase over before init, MiB per GPU")" = "20.0 0.0 0.00" ] ||
      fail "stand-in as A: the increase line reads '$(fields "  increase over before init, MiB per GPU")'"
    check --resources "$tmp/r.json" 2 3 cuda mem_before_init_mib=300,300 mem_after_init_mib=311,300 \
      mem_after_all_mib=319,300 mem_increase_mib=20,0 || fail "stand-in library as A: JSON"
  fi
  # A library that fails (the stand-in library finds one GPU for two ranks) leaves A's figures, n/a for its
  # own, and exit status 1.
  BRAID_MOCK_GPUS=1 timeout 300 "$braid" bench --resources --device host -g 2 --vs "$fake" \
    --json "$tmp/r.json" >"$tmp/out" 2>&1
  status=$?
  [ "$status" -eq 1 ] || fail "a failing library B: exit status $status"
  grep -q "library B.*ncclCommInitAll failed" "$tmp/out" || fail "a failing library B was not reported"
  fields "ncclCommInitAll, ms" | grep -q '^[0-9.]* n/a n/a$' ||
    fail "a failing library B: the init line reads '$(fields "ncclCommInitAll, ms")'"
  grep -q '"name": "B", .*"complete": false' "$tmp/r.json" || fail "a failing library B: JSON"
fi

if [ "$failures" -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all bench --resources checks passed"
