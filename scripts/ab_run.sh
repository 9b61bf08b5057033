#!/usr/bin/env bash
# A kernel change checked and measured in one run on a machine with GPUs:
#   1. builds Braid with its GPU tests (BUILD, default build-gpu; reused when it holds a build);
#   2. checks results with `braid bench -c 1`: every collective eagerly, under CUDA graphs and with one
#      process for both GPUs over the sizes of SWEEP (default -b 8 -e 64M -f 4), and every type and
#      operation of all_reduce, reduce_scatter and reduce over those of TYPES_SWEEP (default -b 1M -e 16M
#      -f 4), for each variant of CHECKED (their indices, default all);
#   3. measures every variant against a reference NCCL with `braid bench --vs`, one run per line of BENCH
#      and per variant, in the same call;
#   4. runs the GPU test cases named in TESTS with what is left of the budget.
# A variant is a list of environment assignments ("" for none), given as arguments; LIB=PATH among them runs
# that build of Braid (another libnccl.so.2, passed to the bench's --lib) instead of BUILD's:
#
#   scripts/ab_run.sh [VARIANT ...]     e.g. scripts/ab_run.sh BRAID_SPREAD=0 BRAID_SPREAD=1
#   scripts/ab_run.sh "" LIB=build-new/lib/libnccl.so.2
#
# Environment: OUT (default ./ab-out), REF_NCCL_HOME (default: the NCCL of Python's nvidia-nccl package),
# NGPUS (default 2), TESTS ("binary:case ..." of build/bin/test_cuda_*, "binary:" or "binary" for all of a
# binary's; default the large cases of test_cuda_coll; "" for none), TEST_LIB_DIR (the folder of the
# libnccl.so.2 the tests load; default BUILD's lib/), SWEEP, TYPES_SWEEP, CHECKED, BENCH (one bench's
# arguments per line; "" for none), BUDGET_S (seconds for everything after the build, default 420: what does not fit is
# reported as skipped), SHARE (D: the ranks share the first D GPUs, `braid bench --gpus D` and the tests'
# `--devices D`, for checks on a machine with fewer GPUs than ranks; the benches then run Braid alone, since
# NCCL refuses ranks that share a GPU).
#
# $OUT receives summary.txt (one line per run: what, exit status, seconds, wrong values; then each bench's
# table) and logs.tgz (every run's full output, and the benches' JSON).
set -u
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
out=${OUT:-$PWD/ab-out}
build=${BUILD:-build-gpu}
ngpus=${NGPUS:-2}
budget=${BUDGET_S:-420}
sweep=${SWEEP:--b 8 -e 64M -f 4}
types_sweep=${TYPES_SWEEP:--b 1M -e 16M -f 4}
tests=${TESTS-test_cuda_coll:procs_large test_cuda_coll:single_large}
bench=${BENCH-"-b 8 -e 64M -f 2 all_reduce
-G -b 8 -e 64M -f 2 all_reduce
-b 256K -e 64M -f 4"}
variants=("$@")
[ ${#variants[@]} -eq 0 ] && variants=("")
checked=${CHECKED-${!variants[*]}}
share=${SHARE:-}
bopt=${share:+--gpus $share}
vs="--vs"
[ -n "$share" ] && vs=
logs=$out/logs
mkdir -p "$logs"
summary=$out/summary.txt
: >"$summary"
ref=${REF_NCCL_HOME:-$(python3 -c 'import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])' 2>/dev/null)}
if [ ! -f "$ref/lib/libnccl.so.2" ]; then
  echo "no reference NCCL found: set REF_NCCL_HOME" | tee -a "$summary"
  exit 2
fi

{
  nvidia-smi -L
  nvidia-smi topo -m
  date -u '+%Y-%m-%d %H:%M:%S UTC'
  git log -1 --format='%h %s' 2>/dev/null
  git status --short 2>/dev/null | head -20
} >"$logs/machine.txt" 2>&1
t0=$SECONDS
# A build made on another machine (carried here) is reused when it runs; otherwise this one builds.
if ! "$build/bin/braid" --version >/dev/null 2>&1; then
  rm -rf "$build"
  (cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DBRAID_TESTS=ON && cmake --build "$build" -j"$(nproc)") \
    >"$logs/build.log" 2>&1 || { echo "build failed" | tee -a "$summary"; tail -30 "$logs/build.log"; exit 1; }
fi
echo "build: $((SECONDS - t0)) s" | tee -a "$summary"
start=$SECONDS

# step NAME LIMIT CMD...: runs CMD (in the current environment) with a time limit bounded by what is left of
# the budget, its output in $logs/NAME.log; one line in the summary.
step() {
  local name=$1 limit=$2 left=$((budget - (SECONDS - start)))
  shift 2
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -lt 10 ]; then
    echo "$name: skipped (out of time)" | tee -a "$summary"
    return
  fi
  local t=$SECONDS
  timeout -k 5 "$limit" "$@" >"$logs/$name.log" 2>&1
  local rc=$? wrong
  # the #wrong columns (out of place, in place) of every row of a bench's tables
  wrong=$(awk '$1 ~ /^[0-9]+$/ && NF >= 10 { if ($10 ~ /^[0-9]+$/) w += $10; if ($14 ~ /^[0-9]+$/) w += $14; r++ }
    END { if (r) printf "%d rows, %d wrong", r, w }' "$logs/$name.log")
  echo "$name: exit $rc, $((SECONDS - t)) s${wrong:+, $wrong}: $*" | tee -a "$summary"
}

# bench_cmd I: sets cmd to the bench command of variant I (its environment, and its library where it names one).
bench_cmd() {
  local a envs=() lib=()
  for a in ${variants[$1]}; do
    case $a in
    LIB=*) lib=(--lib "${a#LIB=}") ;;
    *) envs+=("$a") ;;
    esac
  done
  cmd=(env "${envs[@]}" "$build/bin/braid" bench "${lib[@]}")
}

for i in $checked; do
  bench_cmd "$i"
  step "check$i-eager" 90 "${cmd[@]}" -g "$ngpus" $bopt -c 1 -n 2 -w 1 $sweep
  step "check$i-graphs" 90 "${cmd[@]}" -g "$ngpus" $bopt -c 1 -n 2 -w 1 -G $sweep
  step "check$i-single" 90 "${cmd[@]}" -g "$ngpus" $bopt -c 1 -n 2 -w 1 --single $sweep
  step "check$i-types" 120 "${cmd[@]}" -g "$ngpus" $bopt -c 1 -n 1 -w 1 -d all -o all $types_sweep \
    all_reduce reduce_scatter reduce
done

n=0
while IFS= read -r args; do
  [ -z "$args" ] && continue
  for i in "${!variants[@]}"; do
    bench_cmd "$i"
    step "bench$n-v$i" 150 "${cmd[@]}" ${vs:+--vs "$ref/lib/libnccl.so.2"} -g "$ngpus" $bopt -c 0 $args \
      --json "$logs/bench$n-v$i.json"
  done
  n=$((n + 1))
done <<<"$bench"

# The GPU tests link the CUDA runtime: where this machine keeps it, if the loader does not know.
cudart=$(ldconfig -p 2>/dev/null | awk '/libcudart\.so\.13 / {print $NF; exit}')
[ -z "$cudart" ] && cudart=$(find /usr/local/cuda*/ /opt -name 'libcudart.so.13' 2>/dev/null | head -1)
libs=${TEST_LIB_DIR:-$PWD/$build/lib}${cudart:+:$(dirname "$cudart")}
for t in $tests; do
  bin=${t%%:*} case=
  [ "$bin" != "$t" ] && case=${t#*:} # a binary named alone runs all its cases, as "binary:" does
  step "test-$bin-${case:-all}" 200 env LD_LIBRARY_PATH="$libs" "$build/bin/$bin" ${share:+--devices $share} $case
done

{
  echo
  echo "variants:"
  for i in "${!variants[@]}"; do echo "  v$i: ${variants[$i]:-(none)}"; done
  for f in "$logs"/bench*.log; do
    [ -f "$f" ] || continue
    echo
    echo "== $(basename "$f" .log)"
    grep -v '^#\s*$' "$f" | grep -Ev '^# (Using|Rank|nThread)' | head -80
  done
} >>"$summary"
tar -C "$out" -czf "$out/logs.tgz" logs
rm -rf "$logs"
tail -60 "$summary"
