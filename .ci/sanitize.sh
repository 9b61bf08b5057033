#!/usr/bin/env bash
# CI stage: the unit, fault and bad-input tests under AddressSanitizer and UndefinedBehaviorSanitizer (gcc),
# the threaded ones under ThreadSanitizer (gcc), and the libFuzzer targets (clang) for a bounded time each,
# starting from the corpora in tests/fuzz/corpus. None of these builds compiles CUDA kernels.
# Usage: .ci/sanitize.sh [asan|tsan|fuzz ...] (all three by default); BRAID_FUZZ_S: seconds per fuzz target.
set -euo pipefail
cd "$(dirname "$0")/.."
stages=${*:-asan tsan fuzz}
fuzz_s=${BRAID_FUZZ_S:-40}
export BRAID_DEVICE=host
no_cuda=(-DCMAKE_CUDA_COMPILER= -DBRAID_CUDA_INCLUDE_DIR=OFF -DCMAKE_BUILD_TYPE=Debug)

# Tests of every host module that needs neither a GPU nor root, the fault tests and the bad-input tests.
asan_tests="test_api test_misuse test_faults test_stall test_log test_param test_socket test_fdpass test_watchdog
  test_bootstrap test_hostile test_plan test_workq test_transport test_host_reduce"

stage() { echo "== sanitize: $1 ($(date +%T))"; }

if [[ $stages == *asan* ]]; then
  stage "AddressSanitizer + UndefinedBehaviorSanitizer"
  cmake -S . -B build-asan "${no_cuda[@]}" -DBRAID_WERROR=ON \
    -DCMAKE_C_FLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -O1" \
    >/dev/null
  cmake --build build-asan -j2 --target $asan_tests >/dev/null
  # init with nranks = INT_MAX must get NULL from calloc (and say so), not an abort of the sanitizer's
  ASAN_OPTIONS=allocator_may_return_null=1:detect_leaks=1 \
    ctest --test-dir build-asan -j2 --timeout 300 --output-on-failure -R "/($(echo $asan_tests | tr ' ' '|'))\$"
fi

if [[ $stages == *tsan* ]]; then
  stage "ThreadSanitizer"
  cmake -S . -B build-tsan "${no_cuda[@]}" -DBRAID_WERROR=ON -DCMAKE_C_FLAGS="-fsanitize=thread -O1" >/dev/null
  cmake --build build-tsan -j2 --target test_param test_log test_watchdog test_misuse test_groups >/dev/null
  # Cases whose threads all live in one process: ThreadSanitizer cannot follow a process that forks while it
  # has threads and then starts threads in the child. A report makes the process exit with 66.
  export TSAN_OPTIONS="report_thread_leaks=0 die_after_fork=0"
  b=build-tsan/bin
  $b/test_param
  $b/test_log
  $b/test_watchdog
  $b/test_misuse group_abort group_destroy group_jobs_gone mem_free_foreign deregister_twice \
    destroy_pending_init last_error_scopes self_send_unmatched bad_cta_config dead_comms_bounded
  $b/test_groups threads init_all
  unset TSAN_OPTIONS
fi

if [[ $stages == *fuzz* ]]; then
  stage "libFuzzer, ${fuzz_s} s per target"
  cmake -S . -B build-fuzz "${no_cuda[@]}" -DCMAKE_C_COMPILER=clang -DBRAID_FUZZ=ON \
    -DCMAKE_C_FLAGS="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -O1 -g" \
    >/dev/null
  cmake --build build-fuzz -j2 --target fuzz_parse fuzz_root fuzz_msg >/dev/null
  for t in parse root msg; do
    # new inputs go to a scratch folder; the corpus in the repository only seeds the run
    rm -rf build-fuzz/corpus-$t && mkdir -p build-fuzz/corpus-$t
    ASAN_OPTIONS=allocator_may_return_null=1 build-fuzz/bin/fuzz_$t -max_total_time="$fuzz_s" -print_final_stats=1 \
      -timeout=10 -rss_limit_mb=2048 -artifact_prefix=build-fuzz/crash-$t- \
      build-fuzz/corpus-$t tests/fuzz/corpus/$t 2>&1 | grep -E '^(stat::number_of_executed_units|Done)|ERROR|SUMMARY'
    [ "${PIPESTATUS[0]}" = 0 ] || { echo "fuzz_$t failed: see build-fuzz/crash-$t-*"; exit 1; }
  done
fi
stage done
