#!/usr/bin/env bash
# [transport] congestion_control: every stream of the mesh runs the one
# chosen (ss -ti shows it on both ends of each connection), a step works
# over them, and a name this kernel lacks stops the gateway at start with
# what the kernel offers instead.
. "$(dirname "$0")/lib.sh"

command -v ss >/dev/null || { echo "ss (iproute2) is not installed: skipped"; exit 77; }
available=$(cat /proc/sys/net/ipv4/tcp_available_congestion_control)
default=$(cat /proc/sys/net/ipv4/tcp_congestion_control)
# One the kernel has that is not its default, so the setting shows.
cc=
for c in $available; do
	[ "$c" = "$default" ] || { cc=$c; break; }
done
[ -n "$cc" ] || { echo "the kernel offers only $default: skipped"; exit 77; }
log "kernel: $available (default $default); the mesh runs $cc"

K=2
STREAMS=3
TRANSPORT_EXTRA="congestion_control = \"$cc\""
mesh_start
mesh_up 15
run_ok cc 100003 1 2
# ss -tin prints each connection on one line and its TCP_INFO (with the
# congestion control's name) on the next: both ends of every stream are
# the gateways' (whichever site dialed it).
filter="( sport = :${gw_port[0]} or dport = :${gw_port[0]} or sport = :${gw_port[1]} or dport = :${gw_port[1]} )"
ss -tin state established "$filter" >"$work/ss.out"
with_cc=$(grep -Ec "^\s.*\b$cc\b" "$work/ss.out" || true)
with_default=$(grep -Ec "^\s.*\b$default\b" "$work/ss.out" || true)
log "connection ends between the gateways: $with_cc run $cc, $with_default run $default"
[ "$with_cc" -ge $((2 * STREAMS)) ] && [ "$with_default" = 0 ] ||
	fail "of the streams' ends, $with_cc run $cc (want at least $((2 * STREAMS))), $with_default run $default: $(cat "$work/ss.out")"
mesh_stop

# A name the kernel lacks: the gateway refuses to start, saying what it has.
TRANSPORT_EXTRA='congestion_control = "nosuchcc"'
write_config 0
if "$GRADGATE" --config "$work/${SITES[0]}.toml" 2>"$work/nosuch.log"; then
	fail "a gateway with congestion_control = \"nosuchcc\" started"
fi
expect "$work/nosuch.log" "this kernel has no such TCP congestion control \(it has: $available;" \
	"the refusal names what the kernel offers"
log "refused: $(grep -o 'congestion_control.*' "$work/nosuch.log" | head -n 1)"
