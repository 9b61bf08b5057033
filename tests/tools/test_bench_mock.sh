#!/usr/bin/env bash
# `braid bench --device cuda` without a GPU: the bench drives a stand-in CUDA driver (mock_cudrv.c, built as
# libcuda.so.1 in its own folder) while the measured library runs on its host backend, which takes the
# stand-in's "device" memory for the host memory it is. This covers the bench's GPU paths (driver loading,
# primary contexts, streams, uploads, checks after downloads, events, graph capture and replay, both process
# layouts, the device choice) but no GPU timing. Exits 77 (skipped) where the build has no CUDA headers.
# Run by ctest as: bash test_bench_mock.sh <build-dir>.
set -u
build=${1:?usage: test_bench_mock.sh <build-dir>}
here=$(cd "$(dirname "$0")" && pwd)
braid="$build/bin/braid"
mock="$build/tests/mock_cudrv"
[ -e "$mock/libcuda.so.1" ] || { echo "no stand-in driver (built without CUDA headers): skipped"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
export LD_LIBRARY_PATH="$mock${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export BRAID_MOCK_GPUS=4
cp "$build/lib/libnccl.so.2" "$tmp/libnccl.so.2" || exit 1
# Without nvcc the tool has no floor kernel (`braid info`: "Kernels: none"): the runs leave --floor out.
floor=--floor
"$braid" info | grep -q '^Kernels: none' && floor=

fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

# mock_run NAME EXPECTED-HEADER ARGS...: runs the bench; it must succeed, print EXPECTED-HEADER in its header
# line and report no wrong value.
mock_run() {
  local name=$1 header=$2
  shift 2
  timeout 300 "$braid" bench -b 8 -e 64K -f 8 -n 3 --batch 2 -w 1 -c 1 "$@" >"$tmp/out" 2>&1
  local status=$?
  if [ "$status" -ne 0 ]; then
    fail "$name exited with status $status"
    tail -n 20 "$tmp/out"
    return 1
  fi
  local line
  line=$(grep -m 1 '^# Braid bench:' "$tmp/out")
  echo "$line" | grep -q -- "$header" || fail "$name: header '$line' lacks '$header'"
  grep -q '^# Out of bounds values : 0 OK$' "$tmp/out" || fail "$name: wrong values"
}

# The library on its host backend, the bench on the stand-in's devices.
BRAID_DEVICE=host mock_run "one process per GPU" "2 ranks, cuda, one process per GPU, eager; GPU: Mock GPU 0" \
  --device cuda -g 2 -d all all_reduce alltoall gather
BRAID_DEVICE=host mock_run "--vs, JSON, PNG" "cuda, one process per GPU" --device cuda -g 2 \
  --vs "$tmp/libnccl.so.2" --json "$tmp/r.json" --png "$tmp/r.png" all_reduce reduce_scatter &&
  { python3 "$here/json_check.py" "$tmp/r.json" 2 2 all_reduce reduce_scatter || fail "--vs: JSON"; } &&
  { python3 "$here/png_check.py" "$tmp/r.png" || fail "--vs: PNG"; }
BRAID_DEVICE=host mock_run "--single" "3 ranks, cuda, one process drives every GPU" --device cuda -g 3 --single \
  --vs "$tmp/libnccl.so.2" -o all all_reduce reduce broadcast sendrecv
BRAID_DEVICE=host mock_run "graphs" "2 ranks, cuda, one process per GPU, CUDA graphs" --device cuda -g 2 -G \
  all_reduce all_gather
BRAID_DEVICE=host mock_run "graphs, --single" "CUDA graphs" --device cuda -g 2 -G --single all_reduce

# The floor probe: its column in every row and in the JSON file; pages joined through IPC handles (one
# process per GPU) and through peer access (--single), eagerly and from graphs. Refused without GPUs.
[ -n "$floor" ] && BRAID_DEVICE=host mock_run "--floor" "cuda, one process per GPU" --device cuda -g 2 --floor \
  --vs "$tmp/libnccl.so.2" --json "$tmp/f.json" --png "$tmp/f.png" all_reduce gather &&
  { python3 "$here/json_check.py" "$tmp/f.json" 2 2 all_reduce gather || fail "--floor: JSON"; } &&
  { python3 "$here/png_check.py" "$tmp/f.png" || fail "--floor: PNG"; } &&
  { grep -q '^# F: the floor kernel' "$tmp/out" || fail "--floor: no floor line in the header"; } &&
  { [ "$(awk '/^ +[0-9]/ && NF == 16' "$tmp/out" | wc -l)" -eq 20 ] || fail "--floor: rows without the floor"; }
[ -n "$floor" ] && BRAID_DEVICE=host mock_run "--floor, graphs, --single" "one process drives every GPU, CUDA graphs" \
  --device cuda -g 3 --single -G --floor all_reduce &&
  { [ "$(awk '/^ +[0-9]/ && NF == 15' "$tmp/out" | wc -l)" -eq 5 ] || fail "--floor --single: rows"; }
"$braid" bench --device host -g 2 --floor all_reduce >"$tmp/out" 2>&1
[ $? -eq 2 ] && grep -q "needs --device cuda" "$tmp/out" || fail "--floor on the host was not refused"

# The device choice: the driver's 4 GPUs give 4 ranks on cuda by default; 8 ranks fall back to the host, and
# --device cuda with 8 is refused.
mock_run "default rank count" "4 ranks, cuda" all_reduce
mock_run "more ranks than GPUs" "8 ranks, host backend" -g 8 all_reduce
"$braid" bench --device cuda -g 8 all_reduce >"$tmp/out" 2>&1
[ $? -eq 2 ] && grep -q "fewer GPUs" "$tmp/out" || fail "--device cuda -g 8 with 4 GPUs was not refused"

# --gpus: more ranks than GPUs, sharing them (rank r on GPU r % N), eagerly and from graphs, in both layouts
# (--single: a group of ncclCommInitRank, as ncclCommInitAll takes each GPU once), with the floor's pages on
# a shared GPU; more GPUs than the driver has is refused.
BRAID_DEVICE=host mock_run "--gpus" "8 ranks, cuda, one process per GPU" -g 8 --gpus 4 $floor all_reduce &&
  { grep -q '^# --gpus 4: rank r on GPU r % 4' "$tmp/out" || fail "--gpus: no line in the header"; }
BRAID_DEVICE=host mock_run "--gpus, graphs" "2 ranks, cuda, one process per GPU, CUDA graphs" -g 2 \
  --gpus 1 -G $floor --json "$tmp/g.json" all_reduce sendrecv &&
  { grep -q '"gpus": 1' "$tmp/g.json" || fail "--gpus: not in the JSON file"; }
"$braid" bench -g 8 --gpus 6 all_reduce >"$tmp/out" 2>&1
[ $? -eq 2 ] && grep -q "on 6 GPUs" "$tmp/out" || fail "--gpus 6 with 4 GPUs was not refused"
BRAID_DEVICE=host mock_run "--gpus, --single" "3 ranks, cuda, one process drives every GPU" -g 3 --gpus 2 \
  --single $floor --vs "$tmp/libnccl.so.2" all_reduce reduce_scatter
"$braid" bench -g 2 --gpus 1 --single -G all_reduce >"$tmp/out" 2>&1
[ $? -eq 2 ] && grep -q "drop --single" "$tmp/out" || fail "--gpus --single -G was not refused"

if [ "$failures" -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all bench checks on the stand-in driver passed"
