#!/usr/bin/env bash
# A stream the gateway ends is closed with TLS close_notify, so the peer can
# tell a close from a cut or a truncation. `openssl s_client`, holding
# site-a's certificate, dials site-b's gateway and sends a line that is no
# gradgate message: the gateway names what was wrong in its log and closes
# the stream, close_notify first.
. "$(dirname "$0")/lib.sh"

K=2
make_certs
read -r -a gw_port <<<"$(free_ports 2)"
write_config 1
gw_start 1 || fail "site-b could not listen on ${gw_port[1]}"

certs=$work/certs
printf 'not a gradgate message\n' |
	timeout 10 openssl s_client -connect "127.0.0.1:${gw_port[1]}" -CAfile "$certs/ca.pem" \
		-cert "$certs/site-a.pem" -key "$certs/site-a.key" -alpn gradgate/1 \
		-servername site-b.gradgate.test -msg -ign_eof >"$work/client.out" 2>&1 || true
wait_for "$(site_log 1)" 'event=stream_down site=site-a .*reason="bad message from site site-a' 5 ||
	fail "site-b did not refuse the message"
expect "$work/client.out" 'Alert .*close_notify' "the client saw close_notify"
log "ok: $(grep -E -m1 'Alert .*close_notify' "$work/client.out")"
