#!/usr/bin/env bash
# Braid against a reference NCCL with `braid bench --vs`, on the GPUs of this machine (docs/performance.md):
# all_reduce from 8 B to 4 GiB with one process per GPU, with one process for all GPUs and under CUDA graphs,
# then every collective. Each run writes text, JSON and a PNG to $OUT. Correctness is the GPU check's job
# (scripts/gpu_check.sh); these runs only measure (-c 0).
#
#   scripts/perf_run.sh [NGPUS]
#
# Environment: OUT (default ./perf-out), REF_NCCL_HOME (default: the NCCL of Python's nvidia-nccl package),
# BUILD (default build-gpu: reused when it holds a build), PERF_S (seconds for all runs, default 240), MAXB
# (largest all_reduce size, default 4G), RUNS (which runs, default "ar ar_single ar_graph all").
set -u
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0
ngpus=${1:-$(nvidia-smi -L | wc -l)}
out=${OUT:-$PWD/perf-out}
build=${BUILD:-build-gpu}
budget=${PERF_S:-240}
maxb=${MAXB:-4G}
mkdir -p "$out"
ref=${REF_NCCL_HOME:-$(python3 -c 'import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])' 2>/dev/null)}
if [ ! -f "$ref/lib/libnccl.so.2" ]; then
  echo "no reference NCCL found: set REF_NCCL_HOME"
  exit 2
fi
if [ ! -x "$build/bin/braid" ]; then
  (cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release && cmake --build "$build" -j"$(nproc)") >"$out/build.log" 2>&1 ||
    { tail -20 "$out/build.log"; exit 1; }
fi
start=$SECONDS
# run NAME ARGS...: one bench, bounded by what is left of the budget.
run() {
  local name=$1 left=$((budget - (SECONDS - start)))
  shift
  if [ $left -lt 10 ]; then
    echo "$name: skipped (out of time)" | tee -a "$out/index.txt"
    return
  fi
  local t0=$SECONDS
  timeout $left "$build/bin/braid" bench --vs "$ref/lib/libnccl.so.2" -g "$ngpus" -c 0 "$@" \
    --json "$out/$name.json" --png "$out/$name.png" >"$out/$name.txt" 2>&1
  echo "$name: exit $?, $((SECONDS - t0)) s: braid bench --vs NCCL -g $ngpus -c 0 $*" | tee -a "$out/index.txt"
}
for r in ${RUNS:-ar ar_single ar_graph all}; do
  case $r in
    ar) run ar -b 8 -e "$maxb" -f 2 all_reduce ;;
    ar_single) run ar_single --single -b 8 -e 256M -f 4 all_reduce ;;
    ar_graph) run ar_graph -G -b 8 -e 64M -f 4 all_reduce ;;
    all) run all -b 8 -e 1G -f 8 ;;
  esac
done
