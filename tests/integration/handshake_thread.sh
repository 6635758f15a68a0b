#!/usr/bin/env bash
# TLS handshakes run off the data path: a gateway accepts connections and
# runs their handshakes on a thread of its own (gg-accept), so hundreds of
# full handshakes, each an X25519 exchange, a signature and a certificate
# check, take no time from the threads that move the data. Site-b gets
# HANDSHAKES complete handshakes with site-a's own certificate (each then
# closed before its HELLO); the CPU time of site-b's threads before and
# after says who did the work. Then a step still works.
. "$(dirname "$0")/lib.sh"

HANDSHAKES=400
K=2
THREADS=2
mesh_start
mesh_up 15
run_ok before 1000 1 1

pid=${gw_pid[1]}
# cpu_by_thread: "NAME TICKS" for each thread of site-b's gateway
# (utime + stime, in clock ticks; the name is a thread's comm).
cpu_by_thread() {
	local t
	for t in /proc/"$pid"/task/*; do
		# Fields after the ")" closing the name: state is the 1st, utime the 12th.
		printf '%s %s\n' "$(cat "$t/comm")" \
			"$(sed 's/.*) //' "$t/stat" | awk '{ print $12 + $13 }')"
	done
}
threads=$(cpu_by_thread | cut -d' ' -f1 | sort | tr '\n' ' ')
log "site-b's threads: $threads"
grep -qw gg-accept <<<"$threads" || fail "site-b has no gg-accept thread (threads: $threads)"
grep -qw gg-lane1 <<<"$threads" || fail "site-b has no gg-lane1 thread (threads: $threads)"
cpu_by_thread >"$work/cpu-before"

certs=$work/certs
timeout 120 python3 - 127.0.0.1 "${gw_port[1]}" "$HANDSHAKES" "$certs" >"$work/hs.out" 2>&1 <<'PY' ||
import socket, ssl, sys
host, port, count, certs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
ctx.minimum_version = ssl.TLSVersion.TLSv1_3
ctx.load_verify_locations(f"{certs}/ca.pem")
ctx.load_cert_chain(f"{certs}/site-a.pem", f"{certs}/site-a.key")
ctx.set_alpn_protocols(["gradgate/1"])
done = 0
for _ in range(count):
    with socket.create_connection((host, port), timeout=5) as raw:
        with ctx.wrap_socket(raw, server_hostname="site-b.gradgate.test") as s:
            if s.selected_alpn_protocol() == "gradgate/1":
                done += 1
print(f"handshakes {done} of {count}")
sys.exit(0 if done == count else 1)
PY
	fail "the handshakes did not all complete: $(tail -n 3 "$work/hs.out")"
log "$(cat "$work/hs.out")"
cpu_by_thread >"$work/cpu-after"

# ticks NAME FILE: CPU ticks of the threads called NAME in FILE.
ticks() { awk -v n="$1" '$1 == n { t += $2 } END { print t + 0 }' "$2"; }
gain() { echo $(($(ticks "$1" "$work/cpu-after") - $(ticks "$1" "$work/cpu-before"))); }
accept=$(gain gg-accept)
lanes=$(($(gain gradgate) + $(gain gg-lane1)))
hz=$(getconf CLK_TCK)
log "CPU during $HANDSHAKES handshakes: gg-accept $((accept * 1000 / hz)) ms," \
	"the lanes (gradgate, gg-lane1) $((lanes * 1000 / hz)) ms"
# Each handshake costs the server a few hundred microseconds at least.
[ "$((accept * 1000 / hz))" -ge 20 ] ||
	fail "gg-accept used $((accept * 1000 / hz)) ms for $HANDSHAKES handshakes: they ran elsewhere"
[ "$((lanes * 4))" -le "$accept" ] ||
	fail "the lanes used $((lanes * 1000 / hz)) ms during the handshakes, gg-accept $((accept * 1000 / hz)) ms"
expect "$(site_log 1)" 'event=stream_down site=site-a stream=-1' "site-b closed the connections that never said HELLO"
run_ok after 1000 1 1
mesh_stop
