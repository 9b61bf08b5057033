#!/usr/bin/env bash
# One GPU test under NVIDIA's compute-sanitizer, then the same test repeated plainly with GPU core dumps on
# (docs/gpu-check.md, "Sanitizers and repeats"), on a machine with a GPU and a build in
# build-gpu (or BUILD):
#   1. for each tool of TOOLS, the test under `compute-sanitizer --tool T`, every process it starts included
#      (the tests fork a process per rank);
#   2. the test REPEAT times without a sanitizer, each run with CUDA_ENABLE_COREDUMP_ON_EXCEPTION=1, so that
#      a kernel's exception (an illegal instruction, say) leaves a core dump; cuda-gdb then prints where the
#      faulting warp stood;
#   3. writes $OUT/summary.txt: one line per run (what, exit status, seconds, the sanitizer's error summary),
#      and $OUT/logs.tgz with every run's output. The exit status is 0 when every run passed.
#
#   scripts/gpu_sanitize.sh TEST [ARG...]   e.g. scripts/gpu_sanitize.sh test_cuda_coll --devices 1 procs_ce
#
# Environment: OUT (default ./sanitize-out), TOOLS (default "synccheck memcheck"; "" for none), TOOL_S (seconds
# per sanitizer run, default 180), REPEAT (plain runs, default 5), REPEAT_S (seconds for all of them, default
# 120: runs that no longer fit are reported as skipped), LIB_DIR (the libnccl.so.2 the test loads; default
# BUILD's lib/), BUILD (default build-gpu). NVLink multicast stays off for everything started here.
set -u
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
[ $# -ge 1 ] || {
  echo "usage: $0 TEST [ARG...]" >&2
  exit 2
}
build=${BUILD:-build-gpu}
test_bin=$build/bin/$1
shift
out=${OUT:-$PWD/sanitize-out}
tools=${TOOLS-synccheck memcheck}
tool_s=${TOOL_S:-180}
repeat=${REPEAT:-5}
repeat_s=${REPEAT_S:-120}
libdir=$(cd "${LIB_DIR:-$build/lib}" && pwd)
work=$(mktemp -d)
mkdir -p "$work/logs" "$work/cores"
summary=$out/summary.txt
mkdir -p "$out"
: >"$summary"
export LD_LIBRARY_PATH=$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

failed=0
note() { echo "$*" | tee -a "$summary"; }

# Runs "$@" with a limit of $1 seconds into log $2; adds its line to the summary.
run_one() {
  local limit=$1 log=$work/logs/$2 t0=$SECONDS rc
  shift 2
  timeout -k 10 "$limit" "$@" >"$log" 2>&1
  rc=$?
  local errors
  errors=$(grep -h "ERROR SUMMARY" "$log" | sort | uniq -c | tr -s ' ' | paste -sd ';' -)
  note "$(basename "$log" .log): exit $rc, $((SECONDS - t0)) s${errors:+, $errors}"
  [ "$rc" -eq 0 ] || failed=1
  [ "$rc" -eq 0 ] || grep -m 3 -E "FAIL|Error|error|Illegal|Invalid" "$log" | sed 's/^/    /' | tee -a "$summary"
}

note "== $(nvidia-smi -L 2>&1 | head -4 | paste -sd ';' -); $(compute-sanitizer --version 2>&1 | tail -1)"
note "== $test_bin$(printf ' %q' "$@"); library $(ls -l "$libdir/libnccl.so.2" | awk '{print $NF}')"
for t in $tools; do
  run_one "$tool_s" "$t.log" compute-sanitizer --tool "$t" --target-processes all --error-exitcode 99 \
    --print-limit 20 "$test_bin" "$@"
done

export CUDA_ENABLE_COREDUMP_ON_EXCEPTION=1 CUDA_COREDUMP_FILE=$work/cores/core.%p
export CUDA_COREDUMP_GENERATION_FLAGS='skip_nonrelocated_elf_images,skip_global_memory,skip_shared_memory,skip_local_memory,skip_constbank_memory'
start=$SECONDS
for i in $(seq 1 "$repeat"); do
  left=$((repeat_s - (SECONDS - start)))
  if [ "$left" -le 10 ]; then
    note "plain runs $i-$repeat: skipped, out of time"
    break
  fi
  run_one "$left" "plain-$i.log" "$test_bin" "$@"
done
for core in "$work"/cores/core.*; do
  [ -e "$core" ] || continue
  note "== core dump $(basename "$core")"
  cuda-gdb -batch -ex "target cudacore $core" -ex "info cuda kernels" -ex "bt" -ex 'x/8i $errorpc' \
    >"$work/logs/$(basename "$core").gdb.log" 2>&1
  head -40 "$work/logs/$(basename "$core").gdb.log" | tee -a "$summary"
done
tar -czf "$out/logs.tgz" -C "$work" logs
rm -rf "$work"
exit "$failed"
