#!/usr/bin/env bash
# Fuzzes the monitor's two parsers of untrusted bytes with libFuzzer (clang): the peer message decoder
# (fuzz_wire, src/ras/wire.c) and the client command parser (fuzz_proto, src/ras/proto.c), each for SECONDS,
# starting from the corpus in tests/ras/corpus/ (new inputs go to a scratch copy, not into the repository).
# Prints each target's executions and exits non-zero on any crash, leak or undefined behaviour (the input
# that caused it is left in OUT_DIR). Usage: fuzz.sh OUT_DIR [SECONDS]; without clang it says so and exits 77.
set -u
out=${1:?usage: fuzz.sh OUT_DIR [SECONDS]}
secs=${2:-30}
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cc=${CLANG:-clang}
if ! command -v "$cc" >/dev/null; then
  echo "SKIP: no clang for libFuzzer"
  exit 77
fi
mkdir -p "$out"
# absolute: the fuzzer runs inside OUT_DIR
out=$(cd "$out" && pwd)
status=0
for t in wire proto; do
  bin=$out/fuzz_$t
  "$cc" -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -D_GNU_SOURCE \
    -I "$repo/include" -I "$repo/src" -o "$bin" "$here/fuzz_$t.c" "$repo/src/ras/$t.c" || { status=1; continue; }
  work=$out/corpus_$t
  mkdir -p "$work"
  (cd "$out" && "$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    "$work" "$here/corpus/$t" > "$out/fuzz_$t.log" 2>&1)
  rc=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$out/fuzz_$t.log")
  echo "fuzz_$t: ${runs:-?} executions in $secs s, exit $rc"
  if [ $rc != 0 ]; then
    status=1
    tail -30 "$out/fuzz_$t.log"
  fi
done
exit $status
