#!/usr/bin/env bash
# Connections that never finish their TLS handshake cannot keep real peers
# out. Another loopback address (127.0.0.2) floods site-b's listener with
# hundreds of connections, half of them silent, half stalled in the middle
# of a ClientHello, reopening each as soon as site-b closes it. Meanwhile
# site-a restarts and must be back in the mesh within a few seconds, while
# site-b refuses the flood at once, saying why. Then two addresses flood,
# which fill the pool between them, and site-a only dials in: it takes the
# slot of a flooding handshake. A connection that authenticates but never
# says HELLO is not kept either. Handshakes that fail at once fill the log
# with no more than 10 lines a second.
. "$(dirname "$0")/lib.sh"

K=2

# flood PORT COUNT ADDR...: holds COUNT connections from the ADDRs in turn,
# reopening closed ones (at most 500 a second); "opened N closed N" every
# second into $work/flood.out.
flood() {
	# Emptied here, not only by the background job's redirection, which
	# on a busy host may come after the wait below read an earlier
	# flood's "opened 1234".
	: >"$work/flood.out"
	python3 - 127.0.0.1 "$@" >"$work/flood.out" 2>&1 <<'PY' &
import selectors, socket, sys, time
host, port, count, addrs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
# A ClientHello's record and handshake headers and a few bytes of its body.
partial = bytes.fromhex("16030100c8010000c40303") + bytes(16)
sel = selectors.DefaultSelector()
opened = closed = 0
report = next_batch = time.monotonic()
while True:
    now = time.monotonic()
    for _ in range(5 if now >= next_batch else 0):
        next_batch = now + 0.01
        if len(sel.get_map()) >= count:
            break
        s = socket.socket()
        s.settimeout(0.2)
        try:
            s.bind((addrs[opened % len(addrs)], 0))
            s.connect((host, port))
            if opened // len(addrs) % 2:
                s.sendall(partial)
        except OSError:
            s.close()
            continue
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ)
        opened += 1
    for key, _ in sel.select(timeout=0.01):
        try:
            data = key.fileobj.recv(4096)
        except OSError:
            data = b""
        if not data:
            sel.unregister(key.fileobj)
            key.fileobj.close()
            closed += 1
    if now >= report:
        print(f"opened {opened} closed {closed}", flush=True)
        report = now + 1
PY
	flood_pid=$!
	pids+=("$flood_pid")
	# Past site-b's handshake timeout (2 s): the first held ones have
	# expired and been replaced.
	wait_for "$work/flood.out" '^opened [0-9]{4,}' 10 || fail "the flood did not get going"
	log "flood from ${*:3}: $(tail -n 1 "$work/flood.out")"
}

# restart_a WHAT: site-a restarts under the flood and must be back in the
# mesh within 8 s.
restart_a() {
	gw_stop 0
	[ "$reaped" = 0 ] || fail "site-a exited $reaped on SIGTERM"
	local restarted=${EPOCHREALTIME/[.,]/}
	gw_start 0
	wait_for_since "$(site_log 0)" 'event=mesh_up' 8 ||
		fail "$1: site-a was not back in the mesh 8 s after its restart, under the flood"
	log "$1: site-a back in the mesh $(((${EPOCHREALTIME/[.,]/} - restarted) / 1000)) ms after its restart;" \
		"flood: $(tail -n 1 "$work/flood.out")"
}

mesh_start
mesh_up 15
flood "${gw_port[1]}" 400 127.0.0.2
restart_a "one address"
wait_for "$(site_log 1)" 'event=handshake_refused addr=127\.0\.0\.2 reason=' 5 ||
	fail "site-b did not log why it refused the flood"
log "site-b: $(grep -m1 'event=handshake_refused' "$(site_log 1)")"
run_ok after 1000 1 1
kill "$flood_pid"
wait "$flood_pid" 2>/dev/null || true
mesh_stop

# Two addresses fill site-b's pool between them (each may hold half), and
# site-a only dials in: it gets the slot of a handshake from an address
# that holds more, at once.
DIAL=([0-1]=out [1-0]=in)
mesh_start
mesh_up 15
flood "${gw_port[1]}" 400 127.0.0.2 127.0.0.3
restart_a "two addresses, site-a only dials in"
wait_for "$(site_log 1)" 'event=handshake_evicted addr=127\.0\.0\.[23] held=[0-9]+ reason=' 5 ||
	fail "site-b did not log the handshake it closed for site-a"
log "site-b: $(grep -m1 'event=handshake_evicted' "$(site_log 1)")"
run_ok after-two 1000 1 1
kill "$flood_pid"
wait "$flood_pid" 2>/dev/null || true

# A connection that completes its TLS handshake (with site-a's certificate)
# but never says HELLO leaves the pool after handshake_timeout (2 s) too.
certs=$work/certs
timeout 10 openssl s_client -connect "127.0.0.1:${gw_port[1]}" -CAfile "$certs/ca.pem" \
	-cert "$certs/site-a.pem" -key "$certs/site-a.key" -alpn gradgate/1 \
	-servername site-b.gradgate.test -ign_eof </dev/null >"$work/silent.out" 2>&1 || true
expect "$(site_log 1)" 'event=stream_down site=site-a stream=-1 reason="no HELLO within the handshake timeout"' \
	"site-b closed the silent connection"

# Handshakes that fail at once (no certificate, no ALPN), one after another
# for a second from 127.0.0.2: anyone who reaches the port can make them, so
# site-b logs at most 10 of them a second, then how many it left out.
from=$(($(wc -l <"$(site_log 1)") + 1))
python3 - "${gw_port[1]}" >"$work/fail-flood.out" 2>&1 <<'PY'
import socket, ssl, sys, time
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
n, until = 0, time.monotonic() + 1
while time.monotonic() < until:
    s = socket.socket()
    try:
        s.bind(("127.0.0.2", 0))
        s.settimeout(2)
        s.connect(("127.0.0.1", int(sys.argv[1])))
        ctx.wrap_socket(s).recv(1)
    except (OSError, ssl.SSLError):
        pass
    s.close()
    n += 1
print(n)
PY
deadline=$((${EPOCHREALTIME/[.,]/} + 5000000))
until tail -n "+$from" "$(site_log 1)" | grep -Eq 'event=lines_unlogged of=stream_down site=\? count=[0-9]+'; do
	[ "${EPOCHREALTIME/[.,]/}" -lt "$deadline" ] || break
	sleep 0.05
done
tail -n "+$from" "$(site_log 1)" | grep -Eq 'event=lines_unlogged of=stream_down site=\? count=[0-9]+' ||
	fail "site-b did not say how many failed handshakes it left out of its log"
failed=$(tail -n "+$from" "$(site_log 1)" | grep -c 'event=stream_down site=?' || true)
left=$(tail -n "+$from" "$(site_log 1)" | sed -n 's/.*event=lines_unlogged of=stream_down site=? count=\([0-9]*\).*/\1/p' |
	awk '{ n += $1 } END { print n + 0 }')
log "$(cat "$work/fail-flood.out") failed handshakes in a second: site-b logged $failed, left out $left"
[ "$failed" -le 20 ] || fail "site-b logged $failed failed handshakes of one flooding second, more than 10 a second"
[ $((failed + left)) -ge "$(cat "$work/fail-flood.out")" ] ||
	fail "site-b logged $failed and left out $left failed handshakes, fewer than the $(cat "$work/fail-flood.out") made"
mesh_stop
