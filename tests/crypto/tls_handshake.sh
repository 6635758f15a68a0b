#!/bin/bash
# One case of the TLS handshake matrix. tls_probe runs the gateway's TLS
# stack (crypto/ engine, gateway/ io_uring streams); `openssl s_client` and
# `openssl s_server` are the independent peers. Each case asserts the exact
# message on our side and the alert the other side received.
# Usage: tls_handshake.sh PROBE MAKE_CERTS OPENSSL CASE CERT_CACHE
set -u
probe=$(realpath "$1") make_certs=$(realpath "$2") openssl=$3 case=$4 cache=$5
work=$(mktemp -d)
pids=()
port=

# Stops what the case started; a sanitizer report in any log fails it.
cleanup() {
	local status=$?
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
	wait 2>/dev/null
	if grep -qE "ERROR: (Address|Leak)Sanitizer|runtime error:" "$work"/*.log 2>/dev/null; then
		echo "FAIL ($case): sanitizer report" >&2
		cat "$work"/*.log >&2
		status=1
	fi
	rm -rf "$work"
	exit $status
}
trap cleanup EXIT
trap '' PIPE # a server may close before a scanner finished writing

fail() {
	echo "FAIL ($case): $*" >&2
	for f in server client peer; do
		[ -s "$work/$f.log" ] && sed "s/^/  $f: /" "$work/$f.log" >&2
	done
	exit 1
}

# The cases share one set of certificates, made by the first case of a
# test run (a second of openssl per case otherwise), and made again once
# it is a day old, the CAs being valid for 30 days, or older than the
# script; each case works on a copy of its own, taken under the lock, so
# that no case renews the set while another copies it. (The copy's CA
# configs name the set's first folder: no case signs anything.)
(
	flock 9 || exit 1
	if [ ! -f "$cache/made" ] || [ "$make_certs" -nt "$cache/made" ] ||
		[ -n "$(find "$cache/made" -mmin +1440)" ]; then
		rm -rf "$cache" "$cache.new"
		OPENSSL=$openssl "$make_certs" "$cache.new" >/dev/null 2>&1 && touch "$cache.new/made" &&
			mv "$cache.new" "$cache"
	fi
	cp -a "$cache" "$work/certs"
) 9>"$cache.lock" || fail "cannot make certificates"
cd "$work/certs" || exit 1

# Ephemeral ports differ from run to run: compare with them as PORT.
normalized() {
	sed 's/127\.0\.0\.1:[0-9]*/127.0.0.1:PORT/g' "$1"
}

# start_server [tls_probe serve options]: our server as site-b (from
# $server_cert.pem/.key), admitting site-a; its pid in $server_pid.
server_cert=site-b
start_server() {
	"$probe" serve --ca ca.pem --cert "$server_cert.pem" --key "$server_cert.key" \
		--allow site-a=dns:site-a.gradgate.test "$@" >"$work/server.log" 2>&1 &
	server_pid=$!
	pids+=("$server_pid")
	for _ in $(seq 100); do
		port=$(sed -n 's/^listening on 127\.0\.0\.1://p' "$work/server.log" 2>/dev/null)
		[ -n "$port" ] && return
		sleep 0.05
	done
	fail "our server did not start"
}

# client CERT [s_client options]: s_client presenting CERT ("" for none).
client() {
	local cert=$1
	shift
	local args=(-connect "127.0.0.1:$port" -CAfile ca.pem -brief -ign_eof)
	[ -n "$cert" ] && args+=(-cert "$cert.pem" -key "$cert.key")
	timeout 10 "$openssl" s_client "${args[@]}" "$@" </dev/null >"$work/client.log" 2>&1
}

# expect_line FILE LINE: FILE gets exactly LINE (ports as PORT) within 5 s.
expect_line() {
	for _ in $(seq 100); do
		normalized "$1" 2>/dev/null | grep -qxF -- "$2" && return
		sleep 0.05
	done
	fail "$(basename "$1") lacks the line: $2"
}

expect_text() {
	grep -qF -- "$2" "$1" || fail "$(basename "$1") lacks: $2"
}

# wait_text FILE TEXT: FILE contains TEXT within 5 s.
wait_text() {
	for _ in $(seq 100); do
		grep -qF -- "$2" "$1" 2>/dev/null && return
		sleep 0.05
	done
	fail "$(basename "$1") lacks: $2"
}

# refused CERT SERVER_MESSAGE CLIENT_ALERT [s_client options]
refused() {
	local cert=$1 msg=$2 alert=$3
	shift 3
	client "$cert" -alpn gradgate/1 "$@"
	expect_line "$work/server.log" "refused: peer 127.0.0.1:PORT: $msg"
	expect_text "$work/client.log" "$alert"
	! grep -q "hello from gradgate probe" "$work/client.log" || fail "a refused client got application data"
}

# start_peer_server CERT [s_server options]: s_server presenting CERT.
start_peer_server() {
	local cert=$1
	shift
	# s_server quits at the end of its input: give it a pipe that stays open.
	mkfifo "$work/peer.in"
	exec 5<>"$work/peer.in"
	timeout 10 "$openssl" s_server -accept 127.0.0.1:0 -cert "$cert.pem" -key "$cert.key" \
		-CAfile ca.pem -Verify 2 -verify_return_error -naccept 1 "$@" <"$work/peer.in" >"$work/peer.log" 2>&1 &
	pids+=($!)
	for _ in $(seq 100); do
		port=$(sed -n 's/^ACCEPT 127\.0\.0\.1://p' "$work/peer.log" 2>/dev/null)
		[ -n "$port" ] && return
		sleep 0.05
	done
	fail "s_server did not start"
}

# connect_probe: our client, dialing site-b as site-a.
connect_probe() {
	timeout 10 "$probe" connect "127.0.0.1:$port" --ca ca.pem --cert site-a.pem --key site-a.key \
		--expect site-b=dns:site-b.gradgate.test --send "hello from site-a" >"$work/client.log" 2>&1
}

accepted_a="accepted peer 127.0.0.1:PORT as site 'site-a' (dns:site-a.gradgate.test) with TLS_AES_256_GCM_SHA384"
expect_a="(expected identity dns:site-a.gradgate.test"

valid_handshake() {
	client site-a -alpn gradgate/1 -verify_return_error -verify_hostname site-b.gradgate.test
	expect_text "$work/client.log" "Verification: OK"
	expect_text "$work/client.log" "hello from gradgate probe"
	expect_line "$work/server.log" "$accepted_a"
}

case $case in
valid)
	start_server --close-after-greeting
	valid_handshake
	expect_text "$work/client.log" "Protocol version: TLSv1.3"
	expect_text "$work/client.log" "Ciphersuite: TLS_AES_256_GCM_SHA384"
	;;
valid_uri)
	start_server --close-after-greeting --allow site-d=uri:spiffe://gradgate/site-a
	client site-a-uri -alpn gradgate/1
	expect_text "$work/client.log" "hello from gradgate probe"
	expect_line "$work/server.log" \
		"accepted peer 127.0.0.1:PORT as site 'site-d' (uri:spiffe://gradgate/site-a) with TLS_AES_256_GCM_SHA384"
	;;
unknown_ca)
	start_server --close-after-greeting
	refused foreign-a "certificate is not issued by the configured CA (unknown CA) $expect_a; issuer /CN=foreign CA; sent alert unknown_ca; certificate names dns:site-a.gradgate.test)" \
		"tlsv1 alert unknown ca"
	;;
wrong_identity_client)
	start_server --close-after-greeting
	refused site-c "certificate does not name site 'site-a' $expect_a; sent alert bad_certificate; certificate names dns:site-c.gradgate.test)" \
		"sslv3 alert bad certificate"
	;;
denied_site)
	# site-c is known (its certificate is good) but may not connect: it is
	# told so with access_denied once its handshake completed, and gets no
	# application data. A site nobody configured still gets bad_certificate.
	start_server --close-after-greeting --deny site-c=dns:site-c.gradgate.test
	refused site-c "site 'site-c' may not open connections to this site $expect_a; sent alert access_denied; certificate names dns:site-c.gradgate.test)" \
		"tlsv1 alert access denied"
	expect_text "$work/client.log" "CONNECTION ESTABLISHED"
	refused site-a-uri "certificate does not name site 'site-a' $expect_a; sent alert bad_certificate; certificate names uri:spiffe://gradgate/site-a)" \
		"sslv3 alert bad certificate"
	valid_handshake
	;;
cn_not_trusted)
	start_server --close-after-greeting
	refused cn-site-a "certificate does not name site 'site-a' $expect_a; sent alert bad_certificate; certificate names dns:site-c.gradgate.test)" \
		"sslv3 alert bad certificate"
	;;
expired)
	start_server --close-after-greeting
	refused expired-a "certificate has expired $expect_a; expired 2020-02-01 00:00:00 UTC; sent alert certificate_expired; certificate names dns:site-a.gradgate.test)" \
		"sslv3 alert certificate expired"
	;;
no_client_cert)
	# In TLS 1.3 the client's handshake is complete before the server
	# judges its (empty) certificate: s_client reads the refusal after.
	start_server --close-after-greeting
	refused "" "no client certificate presented $expect_a; sent alert certificate_required)" \
		"tlsv13 alert certificate required"
	expect_text "$work/client.log" "CONNECTION ESTABLISHED"
	;;
no_client_auth)
	start_server --close-after-greeting
	refused noclient-a "certificate is not issued for TLS client authentication $expect_a; extended key usage lacks clientAuth; sent alert unsupported_certificate; certificate names dns:site-a.gradgate.test)" \
		"sslv3 alert unsupported certificate"
	;;
revoked)
	start_server --close-after-greeting --crl crl.pem
	refused revoked-a "certificate is revoked by the configured CRL $expect_a; sent alert certificate_revoked; certificate names dns:site-a.gradgate.test)" \
		"sslv3 alert certificate revoked"
	valid_handshake
	;;
revoked_intermediate)
	# A CA between the peer and the trusted one is checked against the
	# CRLs too: revoked, or without a CRL of its own in the file, it
	# takes its certificates down with it.
	start_server --close-after-greeting --crl crl-chain.pem
	client int-a -alpn gradgate/1 -cert_chain int-ca.pem
	expect_text "$work/client.log" "hello from gradgate probe"
	expect_line "$work/server.log" "$accepted_a"
	refused int-revoked-a "certificate is revoked by the configured CRL $expect_a; revoked: intermediate CA /CN=gradgate revoked intermediate CA; sent alert certificate_revoked; certificate names dns:site-a.gradgate.test)" \
		"sslv3 alert certificate revoked" -cert_chain int-revoked-ca.pem
	;;
crl_of_another_ca)
	# A CRL file that cannot check this site's own chain would refuse
	# every peer: the server does not start, saying whose the fault is.
	! "$probe" serve --ca ca.pem --cert site-b.pem --key site-b.key --allow site-a=dns:site-a.gradgate.test \
		--crl foreign-ca.crl >"$work/server.log" 2>&1 || fail "our server started with another CA's CRL"
	expect_text "$work/server.log" "CRL file 'foreign-ca.crl' cannot check certificate 'site-b.pem' (CA 'ca.pem'): unable to get certificate CRL: with it this site would refuse every peer"
	;;
site_as_issuer)
	# A chain through a certificate that names a site (a site's made a
	# CA's) proves nothing: that site could name any other.
	start_server --close-after-greeting --allow site-b=dns:site-b.gradgate.test
	refused via-b-a "invalid CA certificate $expect_a or dns:site-b.gradgate.test; its issuer names site 'site-b', and a site's certificate may not issue others; sent alert unknown_ca; certificate names dns:site-a.gradgate.test)" \
		"tlsv1 alert unknown ca" -cert_chain site-b-ca.pem
	valid_handshake
	;;
intermediate_without_crl)
	start_server --close-after-greeting --crl crl.pem
	refused int-a "no CRL of the certificate's issuer is configured $expect_a; sent alert unknown_ca; certificate names dns:site-a.gradgate.test)" \
		"tlsv1 alert unknown ca" -cert_chain int-ca.pem
	valid_handshake
	;;
tls12)
	start_server --close-after-greeting
	refused site-a "peer does not offer TLS 1.3 (protocol version) $expect_a; sent alert protocol_version)" \
		"tlsv1 alert protocol version" -tls1_2
	;;
wrong_alpn)
	start_server --close-after-greeting
	client site-a -alpn h2,http/1.1
	expect_line "$work/server.log" "refused: peer 127.0.0.1:PORT: peer does not offer ALPN gradgate/1 $expect_a; offered h2,http/1.1; sent alert no_application_protocol)"
	expect_text "$work/client.log" "tlsv1 alert no application protocol"
	;;
no_alpn)
	start_server --close-after-greeting
	client site-a
	expect_line "$work/server.log" "refused: peer 127.0.0.1:PORT: peer does not offer ALPN gradgate/1 $expect_a; offered none; sent alert no_application_protocol)"
	expect_text "$work/client.log" "tlsv1 alert no application protocol"
	;;
groups)
	# Key exchange is pinned to X25519 and P-256: a client that offers
	# only finite-field groups (ffdhe8192 costs the server hundreds of
	# milliseconds of CPU per handshake) is refused, with what it offered.
	start_server --close-after-greeting
	refused site-a "peer offers no key-exchange group we accept $expect_a; offered ffdhe8192,ffdhe2048; sent alert handshake_failure)" \
		"alert handshake failure" -groups ffdhe8192:ffdhe2048
	client site-a -alpn gradgate/1 -groups P-256
	expect_text "$work/client.log" "Server Temp Key: ECDH, prime256v1"
	client site-a -alpn gradgate/1 -groups P-384:X25519
	expect_text "$work/client.log" "Server Temp Key: X25519"
	;;
server_groups)
	start_peer_server site-b -alpn gradgate/1 -groups ffdhe8192
	connect_probe && fail "our client agreed to a finite-field key exchange"
	expect_line "$work/client.log" "failed: peer 127.0.0.1:PORT: peer found no acceptable parameters (ciphersuites or key-exchange groups?) (expected identity dns:site-b.gradgate.test; alert handshake_failure)"
	;;
log_injection)
	# A refused certificate's names reach the log escaped: no line break,
	# no ESC byte, no bare quote from the peer.
	start_server --close-after-greeting
	refused forged-a "certificate does not name site 'site-a' $expect_a; sent alert bad_certificate; certificate names dns:x\\x0ats=2026-01-01T00:00:00.000Z level=error event=forged\\x1b[31m\\\"quoted\\\")" \
		"sslv3 alert bad certificate"
	! grep -q "^ts=" "$work/server.log" || fail "a certificate name started a log line of its own"
	! grep -q "$(printf '\033')" "$work/server.log" || fail "an ESC byte reached the log"
	;;
server_valid)
	start_peer_server site-b -alpn gradgate/1
	connect_probe
	expect_line "$work/client.log" "connected to peer 127.0.0.1:PORT as site 'site-b' (dns:site-b.gradgate.test) with TLS_AES_256_GCM_SHA384"
	wait_text "$work/peer.log" "hello from site-a"
	;;
server_wrong_identity)
	start_peer_server site-c -alpn gradgate/1
	connect_probe && fail "our client accepted a server named site-c"
	expect_line "$work/client.log" "failed: peer 127.0.0.1:PORT: certificate does not name site 'site-b' (expected identity dns:site-b.gradgate.test; sent alert bad_certificate; certificate names dns:site-c.gradgate.test)"
	wait_text "$work/peer.log" "sslv3 alert bad certificate"
	;;
server_unknown_ca)
	start_peer_server foreign-a -alpn gradgate/1
	connect_probe && fail "our client accepted a server from a foreign CA"
	expect_line "$work/client.log" "failed: peer 127.0.0.1:PORT: certificate is not issued by the configured CA (unknown CA) (expected identity dns:site-b.gradgate.test; issuer /CN=foreign CA; sent alert unknown_ca; certificate names dns:site-a.gradgate.test)"
	wait_text "$work/peer.log" "tlsv1 alert unknown ca"
	;;
server_no_alpn)
	start_peer_server site-b
	connect_probe && fail "our client accepted a server without ALPN gradgate/1"
	expect_line "$work/client.log" "failed: peer 127.0.0.1:PORT: peer did not select ALPN gradgate/1 (expected identity dns:site-b.gradgate.test; selected none)"
	;;
scanners)
	# Port scanners: connect and close, random bytes, an HTTP request.
	# None of them may disturb the listener.
	start_server --close-after-greeting
	exec 3<>"/dev/tcp/127.0.0.1/$port" || fail "cannot connect"
	exec 3>&-
	expect_line "$work/server.log" "refused: peer 127.0.0.1:PORT: connection closed during the TLS handshake $expect_a)"
	exec 3<>"/dev/tcp/127.0.0.1/$port" || fail "cannot connect"
	# Not a record header that names a length longer than what follows
	# (0x01 0x01...): the server would wait for the rest.
	{ printf '\001\001'; head -c 4096 /dev/urandom; } >&3 2>/dev/null
	timeout 5 cat <&3 >/dev/null
	exec 3>&-
	wait_text "$work/server.log" "did not start a TLS handshake"
	normalized "$work/server.log" | grep -q "^refused: peer 127.0.0.1:PORT: peer did not start a TLS handshake (.*) $expect_a" ||
		fail "random bytes were not refused as non-TLS"
	exec 3<>"/dev/tcp/127.0.0.1/$port" || fail "cannot connect"
	printf 'GET / HTTP/1.1\r\nHost: gradgate\r\n\r\n' >&3
	timeout 5 cat <&3 >/dev/null
	exec 3>&-
	expect_line "$work/server.log" "refused: peer 127.0.0.1:PORT: peer did not start a TLS handshake (http request) $expect_a)"
	valid_handshake
	;;
deadline)
	# A peer that starts a ClientHello and stalls is dropped at the
	# deadline, while another peer's handshake goes through meanwhile.
	start_server --close-after-greeting --handshake-timeout-ms 300
	start_ns=$(date +%s%N)
	exec 3<>"/dev/tcp/127.0.0.1/$port" || fail "cannot connect"
	printf '\026\003\001\000\310\001\000\000\304\003\003' >&3
	valid_handshake
	timeout 5 cat <&3 >/dev/null || fail "the stalled connection was not closed"
	elapsed_ms=$((($(date +%s%N) - start_ns) / 1000000))
	exec 3>&-
	expect_line "$work/server.log" "refused: peer 127.0.0.1:PORT: handshake not completed within 300 ms $expect_a)"
	[ "$elapsed_ms" -ge 290 ] && [ "$elapsed_ms" -lt 3000 ] || fail "dropped after $elapsed_ms ms, not about 300"
	;;
reload)
	# SIGHUP reloads certificate and key; a connection made before keeps
	# working, new ones get the new certificate; a failed reload keeps the
	# old credentials.
	# This server echoes and never closes: clients leave at end of input.
	quick_client() {
		timeout 10 "$openssl" s_client -connect "127.0.0.1:$port" -CAfile ca.pem -cert site-a.pem \
			-key site-a.key -alpn gradgate/1 -verify_return_error -brief </dev/null >"$work/client.log" 2>&1
	}
	cp site-b.pem server.pem && cp site-b.key server.key
	server_cert=server
	start_server
	mkfifo "$work/in"
	timeout 20 "$openssl" s_client -connect "127.0.0.1:$port" -CAfile ca.pem -cert site-a.pem -key site-a.key \
		-alpn gradgate/1 -brief <"$work/in" >"$work/peer.log" 2>&1 &
	pids+=($!)
	exec 4>"$work/in"
	expect_line "$work/server.log" "$accepted_a"
	cp site-b-renewed.pem server.pem && cp site-b-renewed.key server.key
	kill -HUP "$server_pid"
	expect_line "$work/server.log" "reloaded credentials (generation 2)"
	echo "still here" >&4
	expect_line "$work/server.log" "received: still here"
	wait_text "$work/peer.log" "still here"
	quick_client
	expect_text "$work/client.log" "Peer certificate: CN = site-b renewed"
	chmod 644 server.key
	kill -HUP "$server_pid"
	expect_line "$work/server.log" "reload failed: private key 'server.key' has permissions 0644: group or others may access it (run chmod 600 on it)"
	echo "after failed reload" >&4
	expect_line "$work/server.log" "received: after failed reload"
	exec 4>&-
	quick_client
	expect_text "$work/client.log" "Peer certificate: CN = site-b renewed"
	;;
connect_refused)
	# Port 1 (tcpmux) has no listener, and lies outside the ephemeral
	# range, so the client cannot connect to itself there.
	port=1
	connect_probe && fail "our client connected to a closed port"
	expect_line "$work/client.log" "failed: peer 127.0.0.1:PORT: connect failed: Connection refused"
	;;
client_deadline)
	# A server that accepts TCP but never answers the ClientHello.
	python3 -c 'import socket, time
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(4)
print("listening on 127.0.0.1:%d" % s.getsockname()[1], flush=True); time.sleep(20)' >"$work/peer.log" 2>&1 &
	pids+=($!)
	for _ in $(seq 100); do
		port=$(sed -n 's/^listening on 127\.0\.0\.1://p' "$work/peer.log" 2>/dev/null)
		[ -n "$port" ] && break
		sleep 0.05
	done
	timeout 10 "$probe" connect "127.0.0.1:$port" --ca ca.pem --cert site-a.pem --key site-a.key \
		--expect site-b=dns:site-b.gradgate.test --handshake-timeout-ms 400 >"$work/client.log" 2>&1 &&
		fail "our client finished a handshake nobody answered"
	expect_line "$work/client.log" "failed: peer 127.0.0.1:PORT: handshake not completed within 400 ms (expected identity dns:site-b.gradgate.test)"
	;;
secrets_not_logged)
	# s_client and s_server write the connection's traffic secrets to a
	# key log; nothing our server or client prints may hold one of them.
	no_secret_in() {
		[ -s "$2" ] || fail "$(basename "$2") is empty"
		for secret in $(awk '{print $3}' "$2"); do
			! grep -qi -- "$secret" "$1" || fail "$(basename "$1") holds a traffic secret"
		done
	}
	start_server --close-after-greeting
	client site-a -alpn gradgate/1 -keylogfile "$work/client-keys.txt"
	expect_line "$work/server.log" "$accepted_a"
	expect_line "$work/server.log" "peer 127.0.0.1:PORT closed the connection"
	no_secret_in "$work/server.log" "$work/client-keys.txt"
	start_peer_server site-b -alpn gradgate/1 -keylogfile "$work/server-keys.txt"
	connect_probe
	wait_text "$work/peer.log" "hello from site-a"
	no_secret_in "$work/client.log" "$work/server-keys.txt"
	;;
key_permissions)
	chmod 640 site-b.key
	"$probe" serve --ca ca.pem --cert site-b.pem --key site-b.key --allow site-a=dns:site-a.gradgate.test \
		>"$work/server.log" 2>&1 && fail "our server started with a group-readable key"
	expect_line "$work/server.log" "cannot load credentials: private key 'site-b.key' has permissions 0640: group or others may access it (run chmod 600 on it)"
	;;
*)
	fail "unknown case"
	;;
esac
echo "ok ($case)"
