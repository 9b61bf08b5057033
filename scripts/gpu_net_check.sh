#!/usr/bin/env bash
# GPU ranks over a network plugin, on one GPU: two ranks share GPU 0 with NCCL_P2P_DISABLE=1 and
# NCCL_SHM_DISABLE=1, so every byte between them goes through the gpu_net transport and the network, here
# Braid's plugin library (libnccl-net-braid.so) loaded as an external plugin (NCCL_NET_PLUGIN, NCCL_NET=Braid):
#   1. the project's GPU tests (--gpus 2 --devices 1: mostly both ranks in one process) on Braid;
#   2. nccl-tests' collectives with result checking (-c 1), two MPI processes on GPU 0, on Braid;
#   3. the same nccl-tests on the reference NCCL loading Braid's plugin (each rank its own NCCL_HOSTID, so
#      that NCCL takes the two ranks for two hosts and connects them over the network);
# then writes $OUT/net-summary.md. Every run's log must say that it used network Braid.
#
#   scripts/gpu_net_check.sh
#
# Environment: OUT (default ./gpu-net-out), BUILD (a Braid build with tests and nvcc: bin/ and lib/; default
# build-gpu, made if missing), REF_NCCL_HOME and NCCL_TESTS_SRC as for gpu_check.sh, NCCL_TESTS_BIN (a folder
# of nccl-tests binaries built with MPI=1 against the reference's headers, e.g. WORK/tests of a gpu_check.sh
# run; default: built here), LIMIT_S (seconds per run, default 120).
# Without a GPU (nvidia-smi lists none) it runs step 1 on the host backend (--host) only: the plugin path of
# the host transports.
set -u
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0
. scripts/gpu_check_lib.sh

out=${OUT:-$PWD/gpu-net-out}
build=$(realpath -m "${BUILD:-build-gpu}")
limit=${LIMIT_S:-120}
work=$(mktemp -d)
mkdir -p "$out/logs"
rows=$out/net-results.tsv
: >"$rows"
plugin=$build/lib/libnccl-net-braid.so
net_env=(NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NET_PLUGIN="$plugin" NCCL_NET=Braid NCCL_DEBUG=INFO
         NCCL_DEBUG_SUBSYS=INIT,NET)
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)

if [ ! -x "$build/bin/braid" ] || [ ! -f "$plugin" ]; then
  echo "== building Braid in $build"
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DBRAID_TESTS=ON >"$out/build.log" 2>&1 &&
    cmake --build "$build" -j"$(nproc)" >>"$out/build.log" 2>&1 || { echo "build failed: $out/build.log"; exit 2; }
fi

# row STEP WHAT STATUS LOG: one result, which counts as a pass only if the log shows the network in use.
row() {
  local verdict
  verdict=$(gt_verdict "$3")
  if [ "$3" = 0 ] && ! grep -q "Using network Braid\|NET/Plugin.*Braid\|Assigned NET plugin Braid" "$4"; then
    verdict="FAIL: network Braid not used"
  fi
  printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$verdict" "$(basename "$4")" | tee -a "$rows"
}

# ---- 1. GPU tests ----
if [ "$gpus" -ge 1 ]; then
  where=(--gpus 2 --devices 1)
  # the collectives with both ranks in one process: two processes on one GPU wait for its time slices at every
  # call, which would take the whole run (nccl-tests below and the group and abort tests are two processes)
  tests="test_cuda_coll:single_small,single_large test_cuda_group: test_cuda_abort:"
else
  where=(--host)
  tests="test_cuda_coll:procs_small test_cuda_abort: test_cuda_graphs:"
fi
for t in $tests; do
  bin=${t%%:*} cases=${t#*:} log=$out/logs/gpu-$bin.log
  env "${net_env[@]}" LD_LIBRARY_PATH="$build/lib" timeout -k 10 "$limit" "$build/bin/$bin" "${where[@]}" \
    ${cases//,/ } >"$log" 2>&1
  row gpu-tests "$bin ${where[*]} ${cases//,/ }" $? "$log"
done

# ---- 2 and 3. nccl-tests ----
if [ "$gpus" -lt 1 ]; then
  printf 'nccl-tests\t-\tskipped: no GPU\t-\n' | tee -a "$rows"
else
  ref=${REF_NCCL_HOME:-$(python3 -c 'import nvidia.nccl, os; print(list(nvidia.nccl.__path__)[0])' 2>/dev/null)}
  bins=${NCCL_TESTS_BIN:-}
  if [ -z "$bins" ]; then
    mkdir -p "$work/ref/lib" && ln -sf "$ref/include" "$work/ref/include" &&
      ln -sf "$ref/lib/libnccl.so.2" "$work/ref/lib/libnccl.so.2" && ln -sf libnccl.so.2 "$work/ref/lib/libnccl.so"
    mpi_inc=$(mpicc --showme:incdirs 2>/dev/null | awk '{print $1}')
    make -C "${NCCL_TESTS_SRC:-.ext/nccl-tests}" -j"$(nproc)" MPI=1 MPI_HOME="${MPI_HOME:-$(dirname "${mpi_inc:-/usr/include/mpi}")}" \
      NCCL_HOME="$work/ref" BUILDDIR="$work/tests" NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" \
      >"$out/build-nccl-tests.log" 2>&1 || echo "nccl-tests build failed: $out/build-nccl-tests.log"
    bins=$work/tests
  fi
  for lib in braid nccl; do
    [ $lib = braid ] && libdir=$build/lib || libdir=$ref/lib
    for b in all_reduce all_gather reduce_scatter broadcast reduce alltoall sendrecv; do
      log=$out/logs/nt-$lib-$b.log
      # Both ranks on GPU 0 (NCCL_TESTS_DEVICE); each its own NCCL_HOSTID, so that NCCL does not refuse two
      # ranks on one GPU and goes over the network (Braid takes gpu_net either way, as P2P and SHM are off).
      timeout -k 10 "$limit" mpirun --allow-run-as-root --bind-to none -np 2 -x LD_LIBRARY_PATH="$libdir" \
        -x NCCL_NVLS_ENABLE -x NCCL_TESTS_DEVICE=0 $(printf -- '-x %s ' "${net_env[@]}") \
        bash -c 'NCCL_HOSTID=host$OMPI_COMM_WORLD_RANK exec "$0" "$@"' "$bins/${b}_perf" \
        -b 8 -e 32M -f 4 -g 1 -c 1 >"$log" 2>&1
      status=$?
      v=$(nt_verdict $status "$log")
      [ "$v" = pass ] && status=0 || status=1
      row "nccl-tests on $lib" "${b}_perf -b 8 -e 32M -f 4 -g 1 -c 1 ($v)" $status "$log"
    done
  done
fi

{
  echo "# GPU ranks over a network plugin"
  echo
  gpu_name=$(nvidia-smi -L 2>/dev/null | head -1)
  echo "$(date -u +%F), ${gpu_name:-no GPU (host backend only)}; two ranks on GPU 0,"
  echo "NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NET_PLUGIN=libnccl-net-braid.so NCCL_NET=Braid."
  echo
  echo "| step | run | verdict | log |"
  echo "|---|---|---|---|"
  sed 's/\t/ | /g; s/^/| /; s/$/ |/' "$rows"
} >"$out/net-summary.md"
tar czf "$out/net-logs.tgz" -C "$out" logs
cat "$out/net-summary.md"
! grep -qv "	pass	\|skipped" "$rows"
