#!/usr/bin/env bash
# Acceptance: NCCL's own RAS client (ncclras), built from NCCL's published source, queries a running Braid job.
# The source trees are looked for in BRAID_NCCL_SRC (a colon-separated list of NCCL checkouts) or under .ext/
# beside this repository (.ext/nccl*/ with src/ras/client.cc); each is built here with g++, outside the
# library. Without any (or without g++), the test is skipped (exit 77). For each client: a 4-rank job on this
# host; the text status must show the job (4 ranks, RUNNING); the JSON status must parse strictly with 1
# communicator of 4 ranks and none missing; -v and -t must work; a client with -m must enter monitor mode.
set -u
build=${1:?usage: test_ncclras.sh BUILD_DIR}
bin=$build/bin
repo=$(cd "$(dirname "$0")/../.." && pwd)
srcs=()
IFS=: read -r -a given <<< "${BRAID_NCCL_SRC:-}"
for d in "${given[@]}" "$repo"/.ext/nccl*; do
  [ -n "$d" ] && [ -f "$d/src/ras/client.cc" ] && [ -f "$d/src/nccl.h.in" ] && srcs+=("$(cd "$d" && pwd)")
done
if [ ${#srcs[@]} = 0 ] || ! command -v g++ >/dev/null; then
  echo "SKIP: no NCCL source tree with src/ras/client.cc (set BRAID_NCCL_SRC or put one under .ext/), or no g++"
  exit 77
fi

work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done; rm -rf "$work"; }
trap cleanup EXIT

# Builds NCCL's client from tree $1 into $2: nccl.h is generated from nccl.h.in (without CUDA's headers: the
# client uses none of their types).
build_client() {
  local src=$1 out=$2 maj min pat suf
  maj=$(sed -n 's/^NCCL_MAJOR *:= *//p' "$src/makefiles/version.mk")
  min=$(sed -n 's/^NCCL_MINOR *:= *//p' "$src/makefiles/version.mk")
  pat=$(sed -n 's/^NCCL_PATCH *:= *//p' "$src/makefiles/version.mk")
  suf=$(sed -n 's/^NCCL_SUFFIX *:= *//p' "$src/makefiles/version.mk")
  mkdir -p "$out/include"
  sed -e "s/\${nccl:Major}/$maj/g" -e "s/\${nccl:Minor}/$min/g" -e "s/\${nccl:Patch}/$pat/g" \
      -e "s/\${nccl:Suffix}/$suf/g" -e "s/\${nccl:Version}/$(printf %d%02d%02d "$maj" "$min" "$pat")/g" \
      -e '/#include <cuda_/d' -e 's/^#define NCCL_H_$/&\ntypedef struct CUstream_st *cudaStream_t;/' \
      "$src/src/nccl.h.in" > "$out/include/nccl.h"
  g++ -O1 -DNCCL_OS_LINUX -I "$out/include" -I "$src/src/include" -o "$out/ncclras" "$src/src/ras/client.cc" \
    -lpthread > "$out/build.log" 2>&1 && echo "$maj.$min.$pat$suf"
}

port=$(( 21000 + $$ % 20000 ))
ras_port=$(( port + 1 ))
for r in 0 1 2 3; do
  NCCL_COMM_ID=127.0.0.1:$port NCCL_RAS_ADDR=127.0.0.1:$ras_port "$bin/ras_rank" $r 4 "$work/stop" \
    > "$work/rank$r.log" 2>&1 &
  pids+=($!)
done

status=0
tried=""
for src in "${srcs[@]}"; do
  out=$work/client$(echo "$src" | cksum | cut -d' ' -f1)
  version=$(build_client "$src" "$out") || { echo "building NCCL's client from $src failed:"; cat "$out/build.log"; status=1; continue; }
  c="$out/ncclras -h 127.0.0.1 -p $ras_port"
  ok=0
  for i in $(seq 1 60); do
    $c -f json > "$out/status.json" 2>/dev/null &&
      "$bin/ras_json_check" "$out/status.json" comms=1 size=4 ranks=4 missing=0 processes=4 >/dev/null 2>&1 && ok=1 && break
    sleep 0.5
  done
  if [ $ok = 0 ]; then
    echo "NCCL $version client: no JSON status of the 4-rank job:"; "$bin/ras_json_check" "$out/status.json"; status=1; continue
  fi
  "$bin/ras_json_check" "$out/status.json"
  $c > "$out/status.txt" 2>&1 && grep -q '^Job summary' "$out/status.txt" &&
    grep -Eq '^ +0 +1 +1 +4 +4 +4 +RUNNING +OK$' "$out/status.txt" ||
    { echo "NCCL $version client: text status:"; cat "$out/status.txt"; status=1; }
  $c -v -t 2 > "$out/verbose.txt" 2>&1 && grep -q 'Rank 3: ' "$out/verbose.txt" ||
    { echo "NCCL $version client: verbose status with a timeout:"; cat "$out/verbose.txt"; status=1; }
  if "$out/ncclras" --help 2>&1 | grep -q -- '--monitor'; then
    timeout 2 $c -m all > "$out/monitor.txt" 2>&1
    grep -q 'RAS Monitor Mode' "$out/monitor.txt" || { echo "NCCL $version client: monitor mode:"; cat "$out/monitor.txt"; status=1; }
  fi
  tried="$tried $version"
done
touch "$work/stop"
for p in "${pids[@]}"; do wait "$p" || { echo "a rank failed"; cat "$work"/rank*.log; status=1; }; done
pids=()
echo "NCCL clients tried:$tried"
[ $status = 0 ] && echo "1 passed, 0 failed" || echo "0 passed, 1 failed"
exit $status
