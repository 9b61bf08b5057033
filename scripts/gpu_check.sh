#!/usr/bin/env bash
# The GPU check, in one run on a machine with GPUs: builds Braid, builds nccl-tests (a checkout kept outside
# git, in .ext/nccl-tests by default), runs every *_perf binary with result checking (-c 1) against a reference
# NCCL and against Braid in three modes (one process driving all GPUs, one process per GPU under mpirun, CUDA
# graphs), then all data types and operations for the reducing collectives, and prints a summary table
# (binary x mode x library: pass/fail and wrong values). The summary, the build logs and a tarball of every
# run's log go to $OUT (default ./gpu-check-out).
#
#   scripts/gpu_check.sh [NGPUS]      REF_NCCL_HOME=<dir with include/ and lib/ of NCCL> overrides discovery
#
# NVLink multicast stays off for every program started here.
set -u
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
ngpus=${1:-$(nvidia-smi -L | wc -l)}
out=${OUT:-$PWD/gpu-check-out}
tests_src=${NCCL_TESTS_SRC:-.ext/nccl-tests}
work=$(mktemp -d)
logs=$work/logs
mkdir -p "$out" "$logs"
summary=$out/summary.txt
: >"$summary"

# The reference NCCL: REF_NCCL_HOME, else the one Python's nvidia-nccl package ships.
ref=${REF_NCCL_HOME:-$(python3 -c 'import nvidia.nccl, os; print(list(nvidia.nccl.__path__)[0])' 2>/dev/null)}
if [ -z "$ref" ] || [ ! -f "$ref/include/nccl.h" ]; then
  echo "no reference NCCL found: set REF_NCCL_HOME"; exit 2
fi
# nccl-tests links with -lnccl: give the linker a libnccl.so beside the reference's libnccl.so.2.
mkdir -p "$work/ref/lib"
ln -sf "$ref/include" "$work/ref/include"
ln -sf "$ref/lib/libnccl.so.2" "$work/ref/lib/libnccl.so.2"
ln -sf libnccl.so.2 "$work/ref/lib/libnccl.so"

echo "== machine" | tee "$out/machine.txt"
{ nvidia-smi -L; nvidia-smi topo -m; nvcc --version | tail -1; } >>"$out/machine.txt" 2>&1

echo "== building Braid"
if ! { cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DBRAID_TESTS=OFF &&
       cmake --build build-gpu -j"$(nproc)"; } >"$out/build-braid.log" 2>&1; then
  tail -20 "$out/build-braid.log"; exit 1
fi
build-gpu/bin/braid info >"$out/braid-info.txt" 2>&1

echo "== building nccl-tests"
# MPI's home: where its include/ (and lib/) are, as its compiler wrapper says.
mpi_inc=$(mpicc --showme:incdirs 2>/dev/null | awk '{print $1}')
mpi_home=${MPI_HOME:-$(dirname "${mpi_inc:-/usr/include/mpi}")}
if ! make -C "$tests_src" -j"$(nproc)" MPI=1 MPI_HOME="$mpi_home" NCCL_HOME="$work/ref" BUILDDIR="$work/tests" \
     NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" >"$out/build-nccl-tests.log" 2>&1; then
  tail -20 "$out/build-nccl-tests.log"; exit 1
fi

# Sums nccl-tests' #wrong columns of a log (rows of 13 fields: out-of-place $9, in-place $13).
count_wrong() {
  awk '!/^#/ && NF == 13 { if ($9 ~ /^[0-9]+$/) w += $9; if ($13 ~ /^[0-9]+$/) w += $13 } END { print w + 0 }' "$1"
}

# run LIB MODE BINARY ARGS...: one nccl-tests run, logged, and one summary row.
run() {
  local lib=$1 mode=$2 bin=$3; shift 3
  local libdir log=$logs/$lib-$mode-$bin.log status
  [ "$lib" = braid ] && libdir=$PWD/build-gpu/lib || libdir=$ref/lib
  case $mode in
    procs) timeout 120 mpirun --allow-run-as-root -np "$ngpus" -x LD_LIBRARY_PATH="$libdir" -x NCCL_NVLS_ENABLE \
             "$work/tests/$bin" -g 1 "$@" >"$log" 2>&1 ;;
    *) LD_LIBRARY_PATH="$libdir" timeout 120 "$work/tests/$bin" "$@" >"$log" 2>&1 ;;
  esac
  status=$?
  local wrong; wrong=$(count_wrong "$log")
  local verdict=pass
  { [ $status -ne 0 ] || [ "$wrong" -ne 0 ] || ! grep -q "Out of bounds values : 0 OK" "$log"; } && verdict=FAIL
  printf '%-6s %-8s %-22s %-5s wrong=%s exit=%s\n' "$lib" "$mode" "$bin" "$verdict" "$wrong" "$status" | tee -a "$summary"
}

sizes="-b 8 -e 16M -f 16"
for lib in nccl braid; do
  for bin in $(cd "$work/tests" && ls *_perf | sort); do
    run $lib onegpu "$bin" $sizes -g "$ngpus" -c 1
    run $lib procs "$bin" $sizes -c 1
    run $lib graphs "$bin" $sizes -g "$ngpus" -c 1 -G 5
  done
  for bin in all_reduce_perf reduce_scatter_perf reduce_perf; do
    run $lib alltypes "$bin" -b 8 -e 64K -f 64 -g "$ngpus" -c 1 -d all -o all
  done
done

echo "== summary (library, mode, binary, verdict)"
cat "$summary"
fails=$(grep -c FAIL "$summary")
echo "$fails failing runs"
tar czf "$out/run-logs.tgz" -C "$logs" .
rm -rf "$work"
