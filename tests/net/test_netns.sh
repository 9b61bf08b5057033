#!/usr/bin/env bash
# Multi-host test: three "hosts", each a network namespace with its own address on a private bridge, run one
# rank each of a communicator over the net transport (NCCL_HOSTID differs per host so no rank takes shared
# memory to another): every collective once over the built-in network (Socket) and once over Braid's plugin
# library loaded as an external plugin (libnccl-net-braid.so, network Braid). Given a plugin library and its
# network name, it runs over that plugin instead (e.g. another vendor's TCP plugin).
# Needs root and iproute2; without them the test is skipped.
set -u
build=${1:?usage: test_netns.sh BUILD_DIR [PLUGIN_LIBRARY NETWORK_NAME]}
rank_bin=$build/bin/netns_rank
tag=br$$
hosts=3
subnet=10.213.$(( $$ % 200 + 20 ))

if [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null || ! ip netns add ${tag}probe 2>/dev/null; then
  echo "SKIP: network namespaces need root and iproute2"
  exit 0
fi
ip netns del ${tag}probe

. "$(dirname "$0")/../common/netns.sh"

cleanup() {
  netns_down
}
trap cleanup EXIT

netns_up || exit 1

# run_mode NAME NCCL_NET_PLUGIN NCCL_NET: every rank runs every collective; all must be right, over that network.
run_mode() {
  local mode=$1 plugin=$2 net=$3 status=0 pids=() h
  local port=$(( 20000 + ($$ + ${#mode} * 7) % 20000 ))
  for h in $(seq 0 $((hosts - 1))); do
    ip netns exec ${tag}h$h env NCCL_COMM_ID=$subnet.1:$port NCCL_HOSTID=host$h NCCL_SOCKET_IFNAME=eth0 \
      NCCL_NET_PLUGIN="$plugin" NCCL_NET="$net" \
      BRAID_TIMEOUT_S=60 BRAID_BOOTSTRAP_TIMEOUT_S=60 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET \
      timeout 240 "$rank_bin" $h $hosts > "$build/netns_$mode$h.log" 2>&1 &
    pids+=($!)
  done
  for h in $(seq 0 $((hosts - 1))); do
    if ! wait ${pids[$h]}; then
      echo "$mode: rank $h failed:"; tail -n 30 "$build/netns_$mode$h.log"; status=1
    fi
  done
  # Every rank must have reached the others over the network asked for, never shared memory.
  if grep -h "via shm" "$build"/netns_$mode*.log || ! grep -q "via net" "$build/netns_${mode}0.log"; then
    echo "$mode: ranks on different hosts did not use the net transport"; status=1
  fi
  for h in $(seq 0 $((hosts - 1))); do
    if ! grep -q "Using network $net " "$build/netns_$mode$h.log"; then
      echo "$mode: rank $h did not use network $net"; status=1
    fi
  done
  grep -h "all collectives correct" "$build"/netns_$mode*.log | sed "s/^/$mode: /"
  return $status
}

status=0
if [ $# -ge 3 ]; then
  run_mode plugin "$2" "$3" || status=1
else
  run_mode builtin none Socket || status=1
  run_mode braid "$build/lib/libnccl-net-braid.so" Braid || status=1
fi
[ $status = 0 ] && echo "1 passed, 0 failed" || echo "0 passed, 1 failed"
exit $status
