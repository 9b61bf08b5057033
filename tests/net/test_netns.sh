#!/usr/bin/env bash
# Multi-host test: three "hosts", each a network namespace with its own address on a private bridge, run one
# rank each of a communicator over TCP (the net transport; NCCL_HOSTID differs per host so no rank takes
# shared memory to another). Needs root and iproute2; without them the test is skipped.
set -u
build=${1:?usage: test_netns.sh BUILD_DIR}
rank_bin=$build/bin/netns_rank
tag=br$$
hosts=3
subnet=10.213.$(( $$ % 200 + 20 ))

if [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null || ! ip netns add ${tag}probe 2>/dev/null; then
  echo "SKIP: network namespaces need root and iproute2"
  exit 0
fi
ip netns del ${tag}probe

cleanup() {
  for h in $(seq 0 $((hosts - 1))); do ip netns del ${tag}h$h 2>/dev/null; done
  ip link del ${tag}br 2>/dev/null
}
trap cleanup EXIT

# A bridge in the root namespace; one veth pair per host, its inner end renamed eth0 in the host's namespace.
ip link add ${tag}br type bridge && ip link set ${tag}br up || exit 1
for h in $(seq 0 $((hosts - 1))); do
  ns=${tag}h$h
  ip netns add $ns
  ip link add ${tag}v$h type veth peer name ${tag}p$h
  ip link set ${tag}v$h master ${tag}br up
  ip link set ${tag}p$h netns $ns
  ip -n $ns link set ${tag}p$h name eth0
  ip -n $ns addr add $subnet.$((h + 1))/24 dev eth0
  ip -n $ns link set eth0 up
  ip -n $ns link set lo up
done

port=$(( 20000 + $$ % 20000 ))
pids=()
for h in $(seq 0 $((hosts - 1))); do
  ip netns exec ${tag}h$h env NCCL_COMM_ID=$subnet.1:$port NCCL_HOSTID=host$h NCCL_SOCKET_IFNAME=eth0 \
    BRAID_TIMEOUT_S=60 BRAID_BOOTSTRAP_TIMEOUT_S=60 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=NET \
    timeout 240 "$rank_bin" $h $hosts > "$build/netns_rank$h.log" 2>&1 &
  pids+=($!)
done
status=0
for h in $(seq 0 $((hosts - 1))); do
  if ! wait ${pids[$h]}; then
    echo "rank $h failed:"; cat "$build/netns_rank$h.log"; status=1
  fi
done
# Every rank must have reached the others over TCP, never shared memory.
if grep -h "via shm" "$build"/netns_rank*.log || ! grep -q "via net" "$build"/netns_rank0.log; then
  echo "ranks on different hosts did not use the net transport"; status=1
fi
grep -h "all collectives correct" "$build"/netns_rank*.log
[ $status = 0 ] && echo "1 passed, 0 failed" || echo "0 passed, 1 failed"
exit $status
