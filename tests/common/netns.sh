# Sourced by the tests that run ranks on several "hosts" on one machine (root only): network namespaces
# ${tag}h0.. on a bridge ${tag}br, each with eth0 at $subnet.<host + 1>/24. Set tag, hosts and subnet first.

# Makes the bridge and one namespace per host (a veth pair each, its inner end renamed eth0).
netns_up() {
  ip link add ${tag}br type bridge && ip link set ${tag}br up || return 1
  local h ns
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
}

# Removes what netns_up made (what is missing is skipped).
netns_down() {
  local h
  for h in $(seq 0 $((hosts - 1))); do ip netns del ${tag}h$h 2>/dev/null; done
  ip link del ${tag}br 2>/dev/null
}
