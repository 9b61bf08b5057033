#!/usr/bin/env bash
# Monitoring across hosts: three "hosts", each a network namespace with its own address on a private bridge,
# run one rank each of a job (ras_rank over the net transport). The monitor of each answers clients on its own
# loopback; one status, asked on host 0, must cover all three (3 ranks from 3 addresses, none missing), in
# JSON (checked strictly) and text ("Nodes" 3). Then host 2's rank is killed: host 0's status must show it
# missing and dead. Needs root and iproute2; without them the test is skipped.
set -u
build=${1:?usage: test_ras_netns.sh BUILD_DIR}
bin=$build/bin
tag=br$$
hosts=3
subnet=10.214.$(( $$ % 200 + 20 ))
work=$(mktemp -d)

if [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null || ! ip netns add ${tag}probe 2>/dev/null; then
  echo "SKIP: network namespaces need root and iproute2"
  exit 0
fi
ip netns del ${tag}probe

pids=()
. "$(dirname "$0")/../common/netns.sh"

cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  netns_down
  rm -rf "$work"
}
trap cleanup EXIT

netns_up || exit 1

port=$(( 20000 + $$ % 20000 ))
ras_port=$(( port + 1 ))
for h in $(seq 0 $((hosts - 1))); do
  ip netns exec ${tag}h$h env NCCL_COMM_ID=$subnet.1:$port NCCL_HOSTID=host$h NCCL_SOCKET_IFNAME=eth0 \
    NCCL_RAS_ADDR=127.0.0.1:$ras_port BRAID_TIMEOUT_S=60 BRAID_BOOTSTRAP_TIMEOUT_S=60 \
    "$bin/ras_rank" $h $hosts "$work/stop" > "$work/rank$h.log" 2>&1 &
  pids+=($!)
done

fail() { echo "FAIL: $*"; for h in $(seq 0 $((hosts - 1))); do tail -3 "$work/rank$h.log"; done; echo "0 passed, 1 failed"; exit 1; }
ask() { ip netns exec ${tag}h0 "$bin/braid" ras -h 127.0.0.1 -p $ras_port "$@"; }

# Every process's monitor must have reached the others: poll until the status covers the three hosts.
ok=0
for i in $(seq 1 60); do
  if ask -f json > "$work/status.json" 2>/dev/null &&
     "$bin/ras_json_check" "$work/status.json" comms=1 size=3 ranks=3 missing=0 hosts=3 processes=3 >/dev/null 2>&1; then
    ok=1; break
  fi
  sleep 0.5
done
[ $ok = 1 ] || { "$bin/ras_json_check" "$work/status.json" comms=1 size=3 ranks=3 missing=0 hosts=3 processes=3; fail "no status covering 3 hosts"; }
"$bin/ras_json_check" "$work/status.json"
ask > "$work/status.txt" || fail "text status"
awk '/^\(total\)/ { getline; if ($1 != 3) exit 1; found = 1 } END { exit !found }' "$work/status.txt" ||
  { cat "$work/status.txt"; fail "the text summary does not count 3 nodes"; }

# A host's rank dies: host 0 reports it missing and dead.
kill -9 "${pids[2]}"
dead=0
for i in $(seq 1 40); do
  if ask -f json > "$work/dead.json" 2>/dev/null && grep -q '"considered_dead": true' "$work/dead.json"; then
    dead=1; break
  fi
  sleep 0.5
done
[ $dead = 1 ] || { cat "$work/dead.json"; fail "the killed rank of host 2 is not reported dead"; }
"$bin/ras_json_check" "$work/dead.json" comms=1 size=3 missing=1 || fail "the status after the kill"
touch "$work/stop"
for h in 0 1; do wait "${pids[$h]}" 2>/dev/null; done
echo "status over 3 hosts: correct; the killed host's rank: missing and dead"
echo "1 passed, 0 failed"
