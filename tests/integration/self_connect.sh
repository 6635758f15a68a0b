#!/usr/bin/env bash
# A dial to a port on this host that nothing listens on may be joined to
# itself: TCP can give the connecting socket that very port as its own.
# The gateway must see it for what it is and let the port go at once, not
# hold it through a TLS handshake with itself while the peer that should
# listen there (one restarting) cannot. site-a runs alone in a network
# namespace whose range of ports for outgoing connections is the single
# port of site-b, which is not running: each dial to site-b joins itself.
# As root (network namespaces); skipped otherwise.
. "$(dirname "$0")/lib.sh"

[ "$(id -u)" = 0 ] || { echo "needs root (a network namespace): skipped"; exit 77; }
PATH=$PATH:/usr/sbin:/sbin
for t in unshare ip sysctl; do
	command -v "$t" >/dev/null || { echo "$t is not installed: skipped"; exit 77; }
done
unshare -n true 2>/dev/null || { echo "cannot make a network namespace: skipped"; exit 77; }

K=2
make_certs
read -r -a gw_port <<<"$(free_ports 2)"
write_config 0
port=${gw_port[1]}
log=$(site_log 0)
# The namespace holds only this gateway: killed with it.
unshare -n bash -c 'ip link set lo up && sysctl -qw net.ipv4.ip_local_port_range="$1 $1" && exec "$2" --config "$3"' \
	_ "$port" "$GRADGATE" "$work/site-a.toml" 2>"$log" &
pids+=("$!")
wait_for "$log" 'event=started' 10 || fail "site-a did not start: $(cat "$log")"
wait_for "$log" "127.0.0.1:$port: connect failed: nothing listens there \(the connection was joined to itself\)" 10 ||
	fail "site-a's dials of site-b were not seen joined to themselves: $(grep -m3 'site-b' "$log")"
if grep -E "site=site-b .*(handshake|TLS|SSL)" "$log" | grep -v 'joined to itself' | grep -m1 .; then
	fail "site-a took a connection to itself for site-b's and began a TLS handshake on it"
fi
log "ok: $(grep -m1 -o 'reason="[^"]*joined to itself[^"]*"' "$log")"
