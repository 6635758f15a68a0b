#!/usr/bin/env bash
# [transport] socket_buffer: a fixed size is set past net.core.rmem_max
# where the gateway may (CAP_NET_ADMIN), and where it may not, the stream
# gets what the kernel allows and the log says which limit to raise; with
# "auto" a stream whose kernel autotuning stops short (net.ipv4.tcp_rmem,
# lowered in a namespace of the test's own) gets larger buffers from what
# it measures, up to socket_buffer_max; a fixed size gives the connections
# a gateway accepts the window scale it gives those it dials. Sizes as
# `ss -tm` shows them (the kernel counts twice what SO_RCVBUF sets).
. "$(dirname "$0")/lib.sh"

[ "$(id -u)" = 0 ] || { echo "needs root (CAP_NET_ADMIN, network namespaces): skipped"; exit 77; }
for t in setpriv ss ip; do
	command -v "$t" >/dev/null || { echo "$t is not installed: skipped"; exit 77; }
done
real=$GRADGATE
rmem_max=$(cat /proc/sys/net/core/rmem_max)
ns=gg-sockbuf-$$
at_exit+=('ip netns del "$ns" 2>/dev/null')

# The largest receive buffer among the gateways' connections (kernel count).
largest_rb() {
	"$@" ss -tmn state established |
		awk -v a=":${gw_port[0]}" -v b=":${gw_port[1]}" '
			index($0, a) || index($0, b) { keep = 1; next }
			keep && match($0, /rb[0-9]+/) { v = substr($0, RSTART + 2, RLENGTH - 2) + 0; if (v > m) m = v }
			{ keep = 0 }
			END { print m + 0 }'
}

# one_run JOB COUNT STEPS [PREFIX...]: a mesh of the current settings runs
# a job; rb is then the largest receive buffer (ss run under PREFIX).
one_run() {
	local job=$1 count=$2 steps=$3
	shift 3
	mesh_start
	mesh_up 15
	run_ok "$job" "$count" 1 "$steps"
	rb=$(largest_rb "$@")
}

K=2
STREAMS=2
want=$((2 * rmem_max))
SOCKET_BUFFER=$want
# ---- without CAP_NET_ADMIN: the kernel's limit, and a line naming it
cat >"$work/nocap" <<EOT
#!/bin/sh
exec setpriv --bounding-set=-net_admin --inh-caps=-net_admin "$real" "\$@"
EOT
chmod +x "$work/nocap"
GRADGATE=$work/nocap
one_run capped 100000 1
log "socket_buffer = $want bytes, net.core.rmem_max = $rmem_max, no CAP_NET_ADMIN: receive buffers $rb"
[ "$rb" = $((2 * rmem_max)) ] || fail "receive buffer $rb, expected the kernel's limit $((2 * rmem_max))"
expect "$(site_log 0)" "event=socket_buffer_capped .*net.core.rmem_max = $rmem_max, which binds a process without CAP_NET_ADMIN" \
	"the capped buffer is logged with the limit to raise"
mesh_stop

# ---- with it: the size asked for, and no such line
GRADGATE=$real
one_run full 100000 1
log "the same with CAP_NET_ADMIN: receive buffers $rb"
[ "$rb" = $((2 * want)) ] || fail "receive buffer $rb, expected $((2 * want))"
since_start "$(site_log 0)" >"$work/full.log"
expect_none "$work/full.log" "event=socket_buffer_capped" "no capped buffer with CAP_NET_ADMIN"
mesh_stop

# ---- auto, where autotuning stops at 128 KiB: past it, from the measures
ip netns add "$ns"
ip netns exec "$ns" ip link set lo up
ip netns exec "$ns" sysctl -qw net.ipv4.tcp_rmem="4096 65536 131072" net.ipv4.tcp_wmem="4096 65536 131072"
cat >"$work/in-ns" <<EOT
#!/bin/sh
exec ip netns exec $ns "$real" "\$@"
EOT
chmod +x "$work/in-ns"
GRADGATE=$work/in-ns
SOCKET_BUFFER=auto
TRANSPORT_EXTRA='socket_buffer_max = "4MiB"'
one_run auto 4194304 6 ip netns exec "$ns"
log "socket_buffer = \"auto\", net.ipv4.tcp_rmem max 131072: the largest receive buffer is $rb"
[ "$rb" -gt 131072 ] && [ "$rb" -le $((2 * (4 << 20))) ] ||
	fail "receive buffer $rb: not past autotuning's 131072, or past 2 x socket_buffer_max"
mesh_stop

# ---- a fixed size, where the namespace's limits alone give a smaller
# window scale (7 where net.core.rmem_max is 4 MiB: windows up to 8 MiB):
# the connections each gateway accepted offer the larger scale of its
# buffers, as those it dialed do. Both sites dial, so a stream may have a
# second connection for a moment: every end counts.
SOCKET_BUFFER=$((256 << 20))
TRANSPORT_EXTRA=
mesh_start
mesh_up 15
scales=$(ip netns exec "$ns" ss -tin state established |
	awk -v a=":${gw_port[0]}" -v b=":${gw_port[1]}" '
		index($0, a) || index($0, b) { keep = 1; next }
		keep && match($0, /wscale:[0-9]+,[0-9]+/) { split(substr($0, RSTART + 7, RLENGTH - 7), w, ","); print w[2] }
		{ keep = 0 }' | sort -n | uniq -c | tr -s ' \n' ' ')
space=$((rmem_max > 131072 ? rmem_max : 131072)) base=-15
while ((space > 1)); do space=$((space / 2)) base=$((base + 1)); done
log "socket_buffer = 256 MiB, tcp_rmem max 128 KiB: connections' ends by the window scale they offer (count scale):$scales; the limits alone give $base"
[[ "$scales" =~ ^\ ?([0-9]+)\ ([0-9]+)\ ?$ ]] && [ "${BASH_REMATCH[1]}" -ge 4 ] ||
	fail "the connections' ends offer more than one window scale, or fewer than 4 ends: $scales"
if [ "${BASH_REMATCH[2]}" -gt "$base" ]; then
	:
elif [ "$base" -ge 13 ]; then
	log "net.core.rmem_max gives scale $base itself: the listener's buffer cannot be told apart here"
else
	fail "window scale ${BASH_REMATCH[2]}: no more than the $base the limits alone give"
fi
mesh_stop
