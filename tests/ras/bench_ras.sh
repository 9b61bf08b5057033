#!/usr/bin/env bash
# Benchmark (not a test): collective time with a RAS client polling the job's status at 100 Hz and at 1000 Hz,
# against no client; and at 1000 Hz with the monitor's pooling off (BRAID_RAS_MIN_QUERY_MS=0,
# BRAID_RAS_MAX_STATUS_PER_S=0: every query goes to every process), the worst case. Runs `braid bench`
# (all_reduce, three sizes) REPEATS times per mode, the modes interleaved so that the machine's drift hits
# them alike, with ras_poll asking for the status (JSON) all along; prints the median time per size and mode,
# the spread of the runs without a client (the run-to-run noise), and what the pollers got.
# Usage: bench_ras.sh BUILD_DIR [REPEATS] [bench options...]
# (default: 4 ranks on the host backend; on a GPU machine pass e.g. "-g 1 --device cuda").
set -u
build=${1:?usage: bench_ras.sh BUILD_DIR [REPEATS] [bench options...]}
repeats=${2:-3}
shift $(( $# >= 2 ? 2 : 1 ))
opts=("$@")
[ ${#opts[@]} = 0 ] && opts=(-g 4 --device host)
bin=$build/bin
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
port=$(( 22000 + $$ % 20000 ))
export NCCL_RAS_ADDR=127.0.0.1:$port
for r in $(seq 1 "$repeats"); do
  for mode in 0 100 1000 raw; do
    poller=
    hz=${mode/raw/1000}
    pool=()
    [ $mode = raw ] && pool=(BRAID_RAS_MIN_QUERY_MS=0 BRAID_RAS_MAX_STATUS_PER_S=0)
    if [ $mode != 0 ]; then
      "$bin/ras_poll" $port $hz 600 json > "$work/poll_${mode}_$r.txt" 2>&1 &
      poller=$!
    fi
    env "${pool[@]}" "$bin/braid" bench "${opts[@]}" -b 8 -e 1M -f 128 -n 200 all_reduce \
      --json "$work/bench_${mode}_$r.json" > "$work/bench_${mode}_$r.log" 2>&1 ||
      { echo "bench failed:"; tail "$work/bench_${mode}_$r.log"; }
    if [ -n "$poller" ]; then
      kill -INT $poller 2>/dev/null
      wait $poller 2>/dev/null
    fi
  done
done
python3 - "$work" "$repeats" <<'PY'
import glob, json, statistics, sys
work, reps = sys.argv[1], int(sys.argv[2])
t = {}
modes = (0, 100, 1000, "raw")
for mode in modes:
    for r in range(1, reps + 1):
        try:
            d = json.load(open(f"{work}/bench_{mode}_{r}.json"))
        except Exception:
            continue
        for row in d["results"]:
            if row["place"] == "out":
                t.setdefault((row["bytes"], mode), []).append(row["time_us"][0])
sizes = sorted({k[0] for k in t})
print("all_reduce time (us), median of %d runs per mode; noise = spread of the runs without a client" % reps)
print("%10s %12s %12s %12s %14s %8s" % ("bytes", "no client", "100 Hz", "1000 Hz", "1000 Hz, raw", "noise"))
for s in sizes:
    base = t.get((s, 0), [])
    cols = [statistics.median(t[(s, m)]) if t.get((s, m)) else float("nan") for m in modes]
    noise = (max(base) - min(base)) / statistics.median(base) * 100 if len(base) > 1 else float("nan")
    print("%10d %12.1f %12.1f %12.1f %14.1f %7.0f%%" % (s, *cols, noise))
PY
echo "pollers (the last line of each):"
for f in "$work"/poll_*.txt; do echo "  $(basename "$f" .txt): $(tail -1 "$f")"; done
