#!/usr/bin/env bash
# The GPU check, in one run on a machine with GPUs (docs/gpu-check.md):
#   1. builds Braid with its tests, and nccl-tests (a checkout kept outside git, .ext/nccl-tests by default)
#      against a reference NCCL's headers, both at once;
#   2. runs the project's GPU tests (build-gpu/bin/test_cuda_*) on Braid;
#   3. runs every nccl-tests *_perf binary with result checking (-c 1) against the reference NCCL and against
#      Braid (swapped in with LD_LIBRARY_PATH), one binary after the other, in four modes: one process per GPU
#      under mpirun up to a large size (the bandwidth table), CUDA graphs, every data type and operation for
#      the reducing collectives, and one process driving all GPUs; on one GPU, instead of the last, two
#      processes sharing it, on Braid alone (NCCL refuses that), and the GPU tests run two ranks on it;
#   3a. runs the PyTorch suite (tests/torch) on Braid with 1, 2 and 4 ranks, then on PyTorch's own NCCL;
#   4. with time to spare (or REF_TESTS=1, which runs them right after step 2), runs the GPU tests on the
#      reference NCCL too, which checks the tests themselves;
#   5. writes $OUT/summary.md: the GPU tests (Braid | NCCL), nccl-tests' verdicts (binary x mode, NCCL | Braid:
#      pass, or why not: wrong values, crash, time-out, no table) and the bus bandwidth at the largest size.
#
#   scripts/gpu_check.sh [NGPUS]
#
# Environment: OUT (default ./gpu-check-out), REF_NCCL_HOME (a NCCL with include/ and lib/; default: the one
# Python's nvidia-nccl package ships), NCCL_TESTS_SRC, BUDGET_S (seconds for the whole check, default 500:
# what does not fit is reported as skipped), GPU_TESTS_S (seconds for the GPU tests on one library, default
# 200), LARGE (largest size of the one-process-per-GPU runs, default 1G), REF_TESTS (1: always run the GPU
# tests on NCCL, 0: never, default: with time to spare), NCCL_TESTS (0: skip nccl-tests), MODES (the
# nccl-tests modes to run, of "procs graphs alltypes onegpu", default all four: a check that ran out of time
# can finish in a second run), TORCH_SUITE (0: skip the PyTorch suite), TORCH_RANKS (its world sizes, default
# 1,2,4), TORCH_SUITE_S (seconds for it on Braid, default 420), WORK (scratch folder for the builds of nccl-tests and the logs; default: a new
# temporary one), REUSE_BUILD (1: use build-gpu as it is when its braid runs, e.g. bin/ and lib/ of a build
# carried from another machine, instead of building), NET_CHECK (1: also run scripts/gpu_net_check.sh, two ranks
# on one GPU over Braid's network plugin, into $OUT/net).
#
# $OUT receives summary.md, results.tsv, gpu-tests.tsv, torch-suite.tsv, machine.txt, build.log and logs.tgz
# (every log: gpu-tests/, nccl-tests/, torch/).
# NVLink multicast stays off for every program started here.
set -u
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
. scripts/gpu_check_lib.sh

ngpus=${1:-$(nvidia-smi -L | wc -l)}
out=${OUT:-$PWD/gpu-check-out}
tests_src=${NCCL_TESTS_SRC:-.ext/nccl-tests}
budget=${BUDGET_S:-500}
large=${LARGE:-1G}
ref_tests=${REF_TESTS:-auto}
work=${WORK:-$(mktemp -d)}
mkdir -p "$work"
mkdir -p "$out" "$work/logs/nccl-tests" "$work/logs/gpu-tests"
results=$out/results.tsv
gtests=$out/gpu-tests.tsv
: >"$results"
: >"$gtests"
start=$SECONDS
reserve=20 # seconds kept for the summary and the tarballs
skipped_stages=""

# Seconds left for runs.
left() {
  echo $((budget - reserve - (SECONDS - start)))
}

# The smallest of the arguments.
min() {
  local m=$1
  for v; do [ "$v" -lt "$m" ] && m=$v; done
  echo "$m"
}

# ---- Reference NCCL, machine, builds ----

ref=${REF_NCCL_HOME:-$(python3 -c 'import nvidia.nccl, os; print(list(nvidia.nccl.__path__)[0])' 2>/dev/null)}
if [ -z "$ref" ] || [ ! -f "$ref/include/nccl.h" ]; then
  echo "no reference NCCL found: set REF_NCCL_HOME"
  exit 2
fi
# nccl-tests links with -lnccl: give the linker a libnccl.so beside the reference's libnccl.so.2.
mkdir -p "$work/ref/lib"
ln -sf "$ref/include" "$work/ref/include"
ln -sf "$ref/lib/libnccl.so.2" "$work/ref/lib/libnccl.so.2"
ln -sf libnccl.so.2 "$work/ref/lib/libnccl.so"

echo "== machine" | tee "$out/machine.txt"
{
  nvidia-smi -L
  nvidia-smi topo -m
  nvcc --version | tail -1
  echo "reference NCCL: $ref ($(grep -E '^#define NCCL_(MAJOR|MINOR|PATCH) ' "$ref/include/nccl.h" |
    awk '{v = v (v == "" ? "" : ".") $3} END {print v}'))"
  echo "nccl-tests: $tests_src, version $(grep -ho 'NCCL_TESTS_VERSION "[^"]*"' "$tests_src"/src/*.h 2>/dev/null |
    head -1 | cut -d'"' -f2)"
} >>"$out/machine.txt" 2>&1

echo "== building Braid (with its tests) and nccl-tests"
mpi_inc=$(mpicc --showme:incdirs 2>/dev/null | awk '{print $1}')
mpi_home=${MPI_HOME:-$(dirname "${mpi_inc:-/usr/include/mpi}")}
if [ "${REUSE_BUILD:-0}" = 1 ] && build-gpu/bin/braid --version >/dev/null 2>&1; then
  # a build made elsewhere and carried here (bin/ and lib/ only): nvcc's single-threaded kernel build is the
  # longest step of a check
  echo "reused: $(build-gpu/bin/braid --version)" >"$work/build-braid.log" &
else
  (cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DBRAID_TESTS=ON && cmake --build build-gpu -j"$(nproc)") \
    >"$work/build-braid.log" 2>&1 &
fi
braid_build=$!
run_nccl_tests=${NCCL_TESTS:-1}
if [ "$run_nccl_tests" = 1 ]; then
  make -C "$tests_src" -j"$(nproc)" MPI=1 MPI_HOME="$mpi_home" NCCL_HOME="$work/ref" BUILDDIR="$work/tests" \
    NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" >"$work/build-nccl-tests.log" 2>&1 &
else
  echo "not built (NCCL_TESTS=$run_nccl_tests)" >"$work/build-nccl-tests.log" &
fi
tests_build=$!
wait $braid_build
braid_ok=$?
wait $tests_build
tests_ok=$?
{ echo "==== Braid"; cat "$work/build-braid.log"; echo "==== nccl-tests"; cat "$work/build-nccl-tests.log"; } \
  >"$out/build.log"
if [ $braid_ok -ne 0 ] || [ $tests_ok -ne 0 ]; then
  {
    printf '# GPU check\n\nThe build failed (exit status of Braid'"'"'s: %s, of nccl-tests'"'"': %s); nothing ran.\n\n' \
      $braid_ok $tests_ok
    for part in braid nccl-tests; do
      printf '\nThe end of the %s build'"'"'s log:\n\n```\n' "$part"
      tail -15 "$work/build-$part.log"
      printf '```\n'
    done
  } >"$out/summary.md"
  cat "$out/summary.md"
  exit 1
fi
echo "Braid info:" >>"$out/machine.txt"
build-gpu/bin/braid info >>"$out/machine.txt" 2>&1
echo "built in $((SECONDS - start)) s"

# ---- The project's GPU tests ----

# Upper bounds per test binary, in seconds (each test also bounds every case it runs), and for all of them.
declare -A gt_cap=([test_cuda_coll]=150 [test_cuda_group]=60 [test_cuda_mem]=60 [test_cuda_huge]=90
                   [test_cuda_abort]=60 [test_cuda_graphs]=90 [test_cuda_graphs2]=90 [test_cuda_order]=60
                   [test_cuda_shrink]=90 [test_cuda_oom]=90)
# Ranks per test (default: one per GPU). A lost rank and the shrink after it need three ranks or more, which
# share the GPUs there are (--devices).
declare -A gt_ranks=([test_cuda_shrink]="--gpus $(( ngpus > 4 ? ngpus : 4 )) --devices $ngpus")
gt_order="test_cuda_coll test_cuda_group test_cuda_mem test_cuda_huge test_cuda_abort test_cuda_graphs test_cuda_graphs2
          test_cuda_order test_cuda_shrink test_cuda_oom"
gt_budget=${GPU_TESTS_S:-200}
# one GPU: two ranks share it (Braid runs that, NCCL refuses it: the reference's GPU tests fail there)
gt_default="--gpus $ngpus"
[ "$ngpus" = 1 ] && gt_default="--gpus 2 --devices 1"

# run_gpu_tests LIB LIBDIR: every GPU test on one library; a row per test in $gtests.
run_gpu_tests() {
  local lib=$1 libdir=$2 t stage_end=$((SECONDS + gt_budget))
  echo "== GPU tests on $lib"
  for t in $gt_order; do
    local bin=build-gpu/bin/$t log=$work/logs/gpu-tests/$lib-$t.log limit verdict status t0 detail resolved
    if [ ! -x "$bin" ]; then
      printf '%s\t%s\tFAIL: not built\t\t\n' "$lib" "$t" >>"$gtests"
      continue
    fi
    limit=$(min "${gt_cap[$t]}" "$(left)" $((stage_end - SECONDS)))
    if [ "$limit" -lt 20 ]; then
      printf '%s\t%s\tskipped: out of time\t\t\n' "$lib" "$t" >>"$gtests"
      continue
    fi
    # The binaries find Braid through their RUNPATH, which LD_LIBRARY_PATH overrides: make sure it did.
    resolved=$(LD_LIBRARY_PATH=$libdir ldd "$bin" | awk '$1 ~ /^libnccl\.so/ {print $3}')
    if [ "$(dirname "$(realpath "$resolved" 2>/dev/null)")" != "$(realpath "$libdir")" ]; then
      printf '%s\t%s\tFAIL: libnccl.so resolves to %s, not into %s\t\t\n' "$lib" "$t" "${resolved:-nothing}" "$libdir" \
        >>"$gtests"
      continue
    fi
    echo "# $t on $lib ($resolved), limit $limit s" >"$log"
    t0=$SECONDS
    LD_LIBRARY_PATH=$libdir timeout -k 10 "$limit" "$bin" ${gt_ranks[$t]:-$gt_default} >>"$log" 2>&1
    status=$?
    verdict=$(gt_verdict $status)
    detail=$(grep -m1 -E '^FAIL|timed out' "$log" | cut -c1-300 | tr '\t|`' '   ')
    printf '%s\t%s\t%s\t%s\t%s\n' "$lib" "$t" "$verdict" $((SECONDS - t0)) "$detail" >>"$gtests"
    printf '%-6s %-18s %s (%d s)\n' "$lib" "$t" "$verdict" $((SECONDS - t0))
  done
}

run_gpu_tests braid "$PWD/build-gpu/lib"
if [ "$ref_tests" = 1 ]; then run_gpu_tests nccl "$ref/lib"; fi

# ---- PyTorch ----

# The PyTorch suite (tests/torch) on Braid under torch.distributed, with 1, 2 and 4 ranks (sharing GPUs where
# there are fewer), then on PyTorch's own NCCL where it can run (a rank per GPU). TORCH_SUITE=0 skips it.
torch_line="not run (TORCH_SUITE=0, or no PyTorch)"
if [ "${TORCH_SUITE:-1}" = 1 ] && python3 -c 'import torch' 2>/dev/null; then
  echo "== PyTorch suite"
  mkdir -p "$work/logs/torch"
  limit=$(min "${TORCH_SUITE_S:-420}" "$(left)")
  timeout -k 10 "$limit" python3 tests/torch/run_torch_suite.py --lib build-gpu/lib/libnccl.so.2 \
    --ranks "${TORCH_RANKS:-1,2,4}" --out "$work/logs/torch/braid" >"$work/logs/torch/braid.txt" 2>&1
  torch_status=$?
  tail -25 "$work/logs/torch/braid.txt"
  torch_line="Braid: $(tail -1 "$work/logs/torch/braid.txt") (exit status $torch_status)"
  limit=$(min 240 "$(left)")
  if [ "$limit" -ge 60 ]; then
    timeout -k 10 "$limit" python3 tests/torch/run_torch_suite.py --ranks "$ngpus" --scenarios main,lazy \
      --out "$work/logs/torch/nccl" >"$work/logs/torch/nccl.txt" 2>&1
    torch_line="$torch_line; PyTorch's own NCCL, $ngpus rank(s): $(tail -1 "$work/logs/torch/nccl.txt")"
  fi
  cp "$work/logs/torch/braid/torch-suite.tsv" "$out/torch-suite.tsv" 2>/dev/null
fi

# ---- nccl-tests ----

# nt_run LIB MODE BINARY LIMIT ARGS...: one nccl-tests run, logged, and one row of $results. Sets nt_secs and
# nt_status.
nt_run() {
  local lib=$1 mode=$2 bin=$3 limit=$4
  shift 4
  local libdir log=$work/logs/nccl-tests/$lib-$mode-$bin.log status t0 largest
  [ "$lib" = braid ] && libdir=$PWD/build-gpu/lib || libdir=$ref/lib
  echo "# $lib $mode $bin $*, limit $limit s" >"$log"
  t0=$SECONDS
  case $mode in
    procs)
      timeout -k 10 "$limit" mpirun --allow-run-as-root --bind-to none -np "$ngpus" -x LD_LIBRARY_PATH="$libdir" \
        -x NCCL_NVLS_ENABLE "$work/tests/$bin" -g 1 "$@" >>"$log" 2>&1 ;;
    shared) # two processes on GPU 0 (Braid only: NCCL refuses ranks that share a GPU)
      timeout -k 10 "$limit" mpirun --allow-run-as-root --bind-to none -np 2 -x LD_LIBRARY_PATH="$libdir" \
        -x NCCL_NVLS_ENABLE -x NCCL_TESTS_DEVICE=0 "$work/tests/$bin" -g 1 "$@" >>"$log" 2>&1 ;;
    *)
      LD_LIBRARY_PATH=$libdir timeout -k 10 "$limit" "$work/tests/$bin" -g "$ngpus" "$@" >>"$log" 2>&1 ;;
  esac
  status=$?
  nt_secs=$((SECONDS - t0))
  nt_status=$status
  largest=$(nt_largest "$log")
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$lib" "$mode" "$bin" "$(nt_verdict $status "$log")" \
    "$(nt_wrong "$log")" $status $nt_secs "${largest% *}" "${largest#* }" >>"$results"
}

# nt_pair MODE BINARY ARGS...: the reference first, then Braid with a limit derived from the reference's time,
# so that a Braid run that hangs costs little more than a working one.
nt_pair() {
  local mode=$1 bin=$2 limit
  shift 2
  limit=$(min 60 "$(left)")
  if [ "$limit" -lt 30 ]; then
    printf '%s\t%s\t%s\tskipped: out of time\t0\t\t\t\t\n' nccl "$mode" "$bin" >>"$results"
    printf '%s\t%s\t%s\tskipped: out of time\t0\t\t\t\t\n' braid "$mode" "$bin" >>"$results"
    return
  fi
  nt_run nccl "$mode" "$bin" "$limit" "$@"
  if [ "$nt_status" -eq 124 ] || [ "$nt_status" -eq 137 ]; then
    limit=$(min "$limit" "$(left)") # the reference timed out too: no more time for Braid than it had
  else
    limit=$(min 120 "$((4 * nt_secs + 20))" "$(left)")
  fi
  if [ "$limit" -lt 10 ]; then
    printf '%s\t%s\t%s\tskipped: out of time\t0\t\t\t\t\n' braid "$mode" "$bin" >>"$results"
    return
  fi
  nt_run braid "$mode" "$bin" "$limit" "$@"
  printf '%-8s %-22s NCCL: %s | Braid: %s\n' "$mode" "$bin" \
    "$(awk -F'\t' -v m="$mode" -v b="$bin" '$1 == "nccl" && $2 == m && $3 == b { v = $4 } END { print v }' "$results")" \
    "$(awk -F'\t' -v m="$mode" -v b="$bin" '$1 == "braid" && $2 == m && $3 == b { v = $4 } END { print v }' "$results")"
}

# Modes in order of what matters most when time runs short: one process per GPU (with the bandwidth table),
# CUDA graphs, every type and operation, one process for all GPUs (which the GPU tests cover too).
if [ "$run_nccl_tests" = 1 ]; then
  echo "== nccl-tests"
  bins=$(cd "$work/tests" && ls *_perf | sort)
  # one GPU: two ranks sharing it are the only multi-rank runs there are (Braid alone)
  default_modes="procs graphs alltypes onegpu"
  [ "$ngpus" = 1 ] && default_modes="shared procs graphs alltypes"
  for mode in ${MODES:-$default_modes}; do
    case $mode in
      procs) for bin in $bins; do nt_pair procs "$bin" -b 8 -e "$large" -f 2 -c 1; done ;;
      graphs) for bin in $bins; do nt_pair graphs "$bin" -b 8 -e 128M -f 4 -c 1 -G 5; done ;;
      alltypes)
        for bin in all_reduce_perf reduce_scatter_perf reduce_perf; do
          nt_pair alltypes "$bin" -b 8 -e 1M -f 32 -c 1 -d all -o all
        done ;;
      onegpu) for bin in $bins; do nt_pair onegpu "$bin" -b 8 -e 128M -f 4 -c 1; done ;;
      shared)
        for bin in $bins; do
          limit=$(min 90 "$(left)")
          if [ "$limit" -lt 20 ]; then
            printf '%s\t%s\t%s\tskipped: out of time\t0\t\t\t\t\n' braid shared "$bin" >>"$results"
            continue
          fi
          nt_run braid shared "$bin" "$limit" -b 8 -e 16M -f 8 -c 1
          printf '%-8s %-22s Braid: %s\n' shared "$bin" "$(awk -F'\t' -v b="$bin" \
            '$1 == "braid" && $2 == "shared" && $3 == b { v = $4 } END { print v }' "$results")"
        done ;;
      *) echo "unknown nccl-tests mode $mode (MODES)" >&2 ;;
    esac
  done
fi

# ---- The GPU tests on the reference, with time to spare ----

if [ "$ref_tests" = auto ]; then
  if [ "$(left)" -ge 150 ]; then
    run_gpu_tests nccl "$ref/lib"
  else
    skipped_stages="the GPU tests on the reference NCCL (REF_TESTS=1 runs them)"
  fi
fi

# ---- GPU ranks over a network plugin, with NET_CHECK=1 (scripts/gpu_net_check.sh; results in $OUT/net) ----
if [ "${NET_CHECK:-0}" = 1 ]; then
  echo "== GPU ranks over a network plugin"
  OUT=$out/net BUILD=build-gpu NCCL_TESTS_BIN=$work/tests REF_NCCL_HOME=$ref LIMIT_S=$(min 120 "$(left)") \
    bash scripts/gpu_net_check.sh || echo "some runs over the network plugin failed: $out/net/net-summary.md"
fi

# ---- Summary ----

header="$(date -u '+%Y-%m-%d %H:%M UTC'), $(nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c |
  awk '{n = $1; $1 = ""; printf "%d x%s", n, $0}'), $ngpus used. $(build-gpu/bin/braid --version 2>&1 | head -1), \
reference NCCL from \`$ref\`. Largest size in the one-process-per-GPU runs: $large. The check took $((SECONDS - start)) s \
of a budget of $budget s${skipped_stages:+; not run for lack of time: $skipped_stages}. NCCL_NVLS_ENABLE=0 throughout."
write_summary "$gtests" "$results" "$header" >"$out/summary.md"
printf '\n## PyTorch suite\n\n%s\n' "$torch_line" >>"$out/summary.md"
# every log in one tarball, so that $OUT stays a handful of files
tar czf "$out/logs.tgz" -C "$work/logs" .
[ -n "${WORK:-}" ] || rm -rf "$work"
cat "$out/summary.md"
# Success means Braid passed everything it ran.
[ "${torch_status:-0}" = 0 ] &&
  ! awk -F'\t' '$1 == "braid" && $3 ~ /^FAIL/ { f = 1 } END { exit !f }' "$gtests" &&
  ! awk -F'\t' '$1 == "braid" && $4 ~ /^FAIL/ { f = 1 } END { exit !f }' "$results"
