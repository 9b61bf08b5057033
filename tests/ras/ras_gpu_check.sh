#!/usr/bin/env bash
# Monitoring on a GPU machine: a job of NRANKS ranks (default 1) on the GPUs (`braid bench`, long enough to be
# queried) must show a correct status through `braid ras` (text, and JSON checked strictly: one communicator
# of NRANKS ranks, none missing, every rank's device set) and through NCCL's own client when NCCL's source is
# at hand (tests/ras/test_ncclras.sh finds it the same way). Then the benchmark: collective time with a client
# polling at 100 Hz and 1000 Hz against none, on the GPUs. Usage: ras_gpu_check.sh BUILD_DIR [NRANKS]
set -u
build=${1:?usage: ras_gpu_check.sh BUILD_DIR [NRANKS]}
n=${2:-1}
bin=$build/bin
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
job=
trap '[ -n "$job" ] && kill $job 2>/dev/null; rm -rf "$work"' EXIT
port=$(( 23000 + $$ % 20000 ))
export NCCL_RAS_ADDR=127.0.0.1:$port
"$bin/braid" bench -g "$n" --device cuda -b 8 -e 256M -f 2 -n 200 all_reduce > "$work/bench.log" 2>&1 &
job=$!
status=0
ok=0
for i in $(seq 1 120); do
  "$bin/braid" ras -f json > "$work/status.json" 2>/dev/null &&
    "$bin/ras_json_check" "$work/status.json" comms=1 size=$n ranks=$n missing=0 >/dev/null 2>&1 && ok=1 && break
  sleep 0.5
done
if [ $ok = 1 ] && ! grep -q '"cuda_dev": -1' "$work/status.json"; then
  "$bin/ras_json_check" "$work/status.json"
  "$bin/braid" ras -v | tee "$work/status.txt" | sed -n '/^Group/,$p'
else
  echo "FAIL: no correct status of the GPU job"; cat "$work/status.json"; tail "$work/bench.log"; status=1
fi
src=""
nccl_src=${BRAID_NCCL_SRC:-}
for d in ${nccl_src//:/ } "$here"/../../.ext/nccl*; do [ -f "$d/src/ras/client.cc" ] && src=$d && break; done
if [ -n "$src" ]; then
  mkdir -p "$work/ncclras/include"
  v=$(sed -n 's/^NCCL_\(MAJOR\|MINOR\|PATCH\) *:= *//p' "$src/makefiles/version.mk" | paste -sd.)
  sed -e "s/\${nccl:[A-Za-z]*}/0/g" -e '/#include <cuda_/d' -e 's/^#define NCCL_H_$/&\ntypedef struct CUstream_st *cudaStream_t;/' \
    "$src/src/nccl.h.in" > "$work/ncclras/include/nccl.h"
  if g++ -O1 -DNCCL_OS_LINUX -I "$work/ncclras/include" -I "$src/src/include" -o "$work/ncclras/ncclras" \
       "$src/src/ras/client.cc" -lpthread; then
    "$work/ncclras/ncclras" -p $port -f json > "$work/nccl.json" &&
      "$bin/ras_json_check" "$work/nccl.json" comms=1 size=$n ranks=$n missing=0 &&
      "$work/ncclras/ncclras" -p $port | grep -q RUNNING && echo "NCCL $v client: correct status" ||
      { echo "FAIL: NCCL $v client"; status=1; }
  fi
else
  echo "(no NCCL source under .ext/ or in BRAID_NCCL_SRC: NCCL's client not tried)"
fi
kill $job 2>/dev/null
wait $job 2>/dev/null
job=
echo "== benchmark: all_reduce with a client polling at 100 and 1000 Hz (GPUs) =="
bash "$here/bench_ras.sh" "$build" 3 -g "$n" --device cuda
exit $status
