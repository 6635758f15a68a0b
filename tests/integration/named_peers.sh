#!/usr/bin/env bash
# Peers named by host name. A dial looks its peer's name up on a thread of
# its own (gateway/io/resolver.h), never on the loop that moves the data,
# so a name server that does not answer costs a site that peer's dials and
# nothing else: its heartbeats and steps go on. The gateways run in a
# network namespace of the test's own, whose resolv.conf names a server
# that never answers (a UDP socket nobody reads) and whose hosts file
# names one peer.
. "$(dirname "$0")/lib.sh"

[ "$(id -u)" = 0 ] || { echo "needs root (network namespaces, /etc/netns): skipped"; exit 77; }
for t in ip ss; do
	command -v "$t" >/dev/null || { echo "$t is not installed: skipped"; exit 77; }
done
ns=gg-names-$$
at_exit+=('ip netns del "$ns" 2>/dev/null; rm -rf "/etc/netns/$ns"')
# ip netns exec puts /etc/netns/NS/* in place of /etc/* for what it runs.
mkdir -p "/etc/netns/$ns"
# A lookup of a name not in hosts waits 5 s for each of its two queries
# (A and AAAA, sent together): longer than heartbeat_timeout.
printf 'nameserver 127.0.0.53\noptions timeout:5 attempts:1\n' >"/etc/netns/$ns/resolv.conf"
{ cat /etc/hosts; echo "127.0.0.1 site-b.named.test"; } >"/etc/netns/$ns/hosts"
ip netns add "$ns"
ip netns exec "$ns" ip link set lo up
cat >"$work/in-ns" <<EOT
#!/bin/sh
exec ip netns exec $ns "$GRADGATE" "\$@"
EOT
chmod +x "$work/in-ns"
GRADGATE=$work/in-ns
ip netns exec "$ns" python3 -c 'import socket, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("127.0.0.53", 53))
time.sleep(600)' &
pids+=("$!")
deadline=$((${EPOCHREALTIME/[.,]/} + 10000000))
until ip netns exec "$ns" ss -Huln | grep -q '127.0.0.53:53 '; do
	[ "${EPOCHREALTIME/[.,]/}" -lt "$deadline" ] || fail "the silent name server did not start"
	sleep 0.02
done

# ---- A name nobody answers for: site-a's dials of site-b wait for their
# lookups, site-b's dials carry the streams, and the site goes on. A loop
# that waited for the lookup would be silent past heartbeat_timeout, and
# every peer would give site-a up.
K=3
HEARTBEAT_INTERVAL=250ms
HEARTBEAT_TIMEOUT=2s
PEER_ADDR=([0-1]=site-b.unanswered.test:@PORT@)
mesh_start
mesh_up 15
wait_for "$(site_log 0)" 'event=dial_failed site=site-b address=site-b.unanswered.test:[0-9]+ ' 30 ||
	fail "site-a logged no failed dial of site-b within 30 s"
log "site-a: $(grep -m1 -o 'event=dial_failed.*' "$(site_log 0)")"
# Steps while the next lookups run.
t0=${EPOCHREALTIME/[.,]/}
while [ $((${EPOCHREALTIME/[.,]/} - t0)) -lt 6000000 ]; do
	run_ok unanswered 100003 1 40
done
for ((i = 0; i < K; i++)); do
	expect_none "$(site_log "$i")" 'event=(step_failed|peer_down|mesh_degraded)' "${SITES[$i]} while site-a's lookups ran"
done
expect "$(site_log 0)" 'event=dial_failed site=site-b .* reason="host name lookup of '"'site-b.unanswered.test'"' failed: ' \
	"the failed dial names the lookup and the host"
lookups=$(grep -c 'event=dial_failed site=site-b' "$(site_log 0)")
elapsed_s=$(((${EPOCHREALTIME/[.,]/} - t_start) / 1000000))
log "site-a logged $lookups failed lookups in $elapsed_s s"
# One line per lookup, which takes 5 s or more.
[ "$lookups" -le $((elapsed_s / 5 + 1)) ] || fail "$lookups dial_failed lines in $elapsed_s s: more than one per lookup"
mesh_stop

# ---- A name the hosts file holds: site-a alone dials site-b, by name.
K=2
DIAL=([0-1]=out [1-0]=in)
PEER_ADDR=([0-1]=site-b.named.test:@PORT@)
mesh_start
mesh_up 15
expect "$(site_log 0)" 'event=stream_up site=site-b stream=0 dialed_by=site-a ' "site-a dialed site-b by name"
run_ok named 100003 1 20
mesh_stop
log "passed"
