#!/usr/bin/env bash
# Recovery across hosts: four "hosts", each a network namespace on a private bridge, run one rank each over
# TCP; rank 2 kills itself in the middle of a stream of all-reduces. The survivors shrink without it, check
# every collective, and grow back to four ranks with a process started afterwards in a fifth namespace,
# which gets the grow token through a file. Needs root and iproute2; without them the test is skipped.
set -u
build=${1:?usage: test_recover_netns.sh BUILD_DIR}
rank_bin=$build/bin/recover_rank
tag=rc$$
hosts=5 # four ranks, then the joiner
nranks=4
victim=2
subnet=10.214.$(( $$ % 200 + 20 ))
token=$build/recover_netns_token.$$

[ -x "$rank_bin" ] || { echo "$rank_bin is missing"; echo "0 passed, 1 failed"; exit 1; }
if [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null || ! ip netns add ${tag}probe 2>/dev/null; then
  echo "SKIP: network namespaces need root and iproute2"
  exit 0
fi
ip netns del ${tag}probe

. "$(dirname "$0")/../common/netns.sh"

cleanup() {
  netns_down
  rm -f "$token" "$token.tmp"
}
trap cleanup EXIT

netns_up || exit 1

run_in() { # host, log, command...
  local h=$1 log=$2
  shift 2
  ip netns exec ${tag}h$h env NCCL_COMM_ID=$subnet.1:$(( 21000 + $$ % 20000 )) NCCL_HOSTID=host$h \
    NCCL_SOCKET_IFNAME=eth0 BRAID_TIMEOUT_S=60 BRAID_BOOTSTRAP_TIMEOUT_S=60 NCCL_DEBUG=WARN \
    timeout 240 "$@" > "$log" 2>&1
}

pids=()
for r in $(seq 0 $((nranks - 1))); do
  run_in $r "$build/recover_rank$r.log" "$rank_bin" $r $nranks $victim "$token" &
  pids+=($!)
done
# The joiner starts only once the new rank 0 has a token for it (or never, when every rank has ended).
for _ in $(seq 1 1200); do
  [ -e "$token" ] && break
  alive=0
  for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
  [ $alive = 1 ] || break
  sleep 0.1
done
status=0
if [ -e "$token" ]; then
  run_in $nranks "$build/recover_join.log" "$rank_bin" join $nranks "$token" &
  join_pid=$!
  wait $join_pid || { echo "the joiner failed:"; cat "$build/recover_join.log"; status=1; }
else
  echo "no grow token came (within 120 s, before the ranks ended)"; status=1
fi
for r in $(seq 0 $((nranks - 1))); do
  wait ${pids[$r]}; rc=$?
  if [ $r = $victim ]; then
    [ $rc = 137 ] || { echo "rank $r should have died by SIGKILL, exit $rc"; status=1; }
  elif [ $rc != 0 ]; then
    echo "rank $r failed ($rc):"; cat "$build/recover_rank$r.log"; status=1
  fi
done
grep -h "correct" "$build"/recover_rank*.log "$build/recover_join.log" 2>/dev/null
[ $status = 0 ] && echo "1 passed, 0 failed" || echo "0 passed, 1 failed"
exit $status
