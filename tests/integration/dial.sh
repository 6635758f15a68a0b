#!/usr/bin/env bash
# Who dials whom: [[peers]] dial = "out" | "in" | "both".
#
# - Every pair of settings that lets one site dial the other (one mesh of
#   four sites, a setting per pair) forms the mesh, on the connections of
#   the site expected (both/both: the one whose name sorts first), and
#   carries steps with exact results; no stream comes or goes once it
#   settled.
# - A site that only dials out (dial = "out" for every peer, "in" at them),
#   behind NAT: its peers have no address for it, and status shows none.
#   With "both" at them, their address for it is a closed port.
# - Both "in": nobody dials; the incomplete mesh, and a step that waits for
#   it, name the dial settings as the likely cause. One "out" whose address
#   for the other is wrong: the other names its refusal and that address. A peer with another
#   site's certificate: they name the certificate. Both "out": each site
#   refuses the other's streams, and each says so, naming the conflict.
# - A peer of another release: both versions logged at error level, and
#   named in a step that waits for it.
# - A peer a site does not accept inbound (its dial for it is "out") gets a
#   TLS alert, access_denied: openssl s_client with that peer's certificate
#   reports it; an identity the site does not know gets bad_certificate.
# - Both sites dial at once: they settle on the first site's connections
#   (a duplicate, where two dials met, is closed saying why), and the steps
#   are exact; after every connection is reset mid-job, both redial and
#   settle on the first site's connections again.
. "$(dirname "$0")/lib.sh"

K=2
CODEC=fp32
HEARTBEAT_TIMEOUT=2s

# last_dialer I J S: the site that dialed the connection site I last
# brought up for stream S to site J.
last_dialer() {
	since_start "$(site_log "$1")" |
		sed -n "s/.*event=stream_up site=${SITES[$2]} stream=$3 dialed_by=\([a-z0-9-]*\) .*/\1/p" | tail -n 1
}

# settled_on I J D: every stream between sites I and J is, at both sites,
# the connection site D dialed.
settled_on() {
	local s
	for ((s = 0; s < STREAMS; s++)); do
		[ "$(last_dialer "$1" "$2" "$s")" = "${SITES[$3]}" ] && [ "$(last_dialer "$2" "$1" "$s")" = "${SITES[$3]}" ] ||
			return 1
	done
}

# wait_settled I J D SECONDS
wait_settled() {
	local deadline=$((${EPOCHREALTIME/[.,]/} + $4 * 1000000))
	until settled_on "$1" "$2" "$3"; do
		[ "${EPOCHREALTIME/[.,]/}" -lt "$deadline" ] || return 1
		sleep 0.05
	done
}

ups() { since_start "$(site_log "$1")" | grep -c 'event=stream_up' || true; }

# expect_none_now I REGEX WHAT: no line of site I's current run matches.
expect_none_now() {
	local lines
	lines=$(since_start "$(site_log "$1")")
	if grep -Eq -- "$2" <<<"$lines"; then
		fail "$3: unexpected line in ${SITES[$1]}'s log: $(grep -E -m1 -- "$2" <<<"$lines")"
	fi
}

# both_say FN WHAT: each site I of the pair logs within 10 s a line that
# matches what `FN I J` prints (J: the other one).
both_say() {
	local i
	for i in 0 1; do
		wait_for_since "$(site_log "$i")" "$("$1" "$i" $((1 - i)))" 10 || fail "${SITES[$i]} did not say $2"
	done
}

# The lines: nobody dials (both "in"); the conflict, and the refused
# streams (both "out"). In the log, quotes within a value are escaped.
nobody_dials() {
	echo "event=mesh_degraded site=${SITES[$1]} unreachable=1 reason=\"site ${SITES[$2]}: never connected: site ${SITES[$1]}'s \[\[peers\]\] dial for ${SITES[$2]} is \\\\\"in\\\\\", so ${SITES[$2]} must dial it"
}
conflict() {
	echo "level=error event=dial_refused site=${SITES[$2]} dial=out reason=\"site ${SITES[$2]} refuses the streams this site dials \(access_denied: its \[\[peers\]\] dial for ${SITES[$1]} is \\\\\"out\\\\\"\), and this site's dial for ${SITES[$2]} is \\\\\"out\\\\\" too"
}
refused() { echo "level=warn event=stream_refused site=${SITES[$2]} dial=out "; }

# step_fails JOB REGEX WHAT: a step of one rank at site-a fails, and its
# error matches REGEX.
step_fails() {
	rank_start "$1" 1000 0 1 0 1 --timeout-ms 8000
	ranks_wait
	[ "${rank_rc[$1-s0-r0]}" = 1 ] || fail "$3: the step ended with status ${rank_rc[$1-s0-r0]}"
	expect "$work/$1-s0-r0.err" "$2" "$3"
	log "$3: $(cat "$work/$1-s0-r0.err")"
}

# Every pair of settings that lets a site dial the other, on one mesh of
# four sites: each of its six pairs has its own. PAIRS: "I J DIAL_IJ
# DIAL_JI DIALER" (("in", "both") is ("both", "in") seen from the other
# site).
K=4
PAIRS=("0 1 out in 0" "0 2 in out 2" "0 3 both both 0" "1 2 both in 1" "1 3 both out 3" "2 3 out both 2")
DIAL=()
for p in "${PAIRS[@]}"; do
	read -r i j dij dji _ <<<"$p"
	DIAL[$i-$j]=$dij DIAL[$j-$i]=$dji
done
mesh_start
mesh_up 15
for p in "${PAIRS[@]}"; do
	read -r i j dij dji dialer <<<"$p"
	wait_settled "$i" "$j" "$dialer" 5 ||
		fail "$dij/$dji: streams between ${SITES[$i]} and ${SITES[$j]} not all dialed by ${SITES[$dialer]} at both"
done
run_ok pairs 100003 1 2
before=()
for ((i = 0; i < K; i++)); do
	before[$i]=$(ups "$i")
	[ "${before[$i]}" -le $((2 * STREAMS * (K - 1))) ] ||
		fail "${SITES[$i]} brought up ${before[$i]} streams for $((STREAMS * (K - 1)))"
done
sleep 0.5 # past reconnect_max: a dial that replaces a stream would have come
for ((i = 0; i < K; i++)); do
	[ "$(ups "$i")" = "${before[$i]}" ] || fail "${SITES[$i]}'s streams changed after they settled"
	expect_none_now "$i" 'level=(warn|error) event=(dial_refused|stream_refused)|event=step_failed' "pairs"
done
for p in "${PAIRS[@]}"; do
	read -r i j dij dji dialer <<<"$p"
	log "$dij/$dji: streams between ${SITES[$i]} and ${SITES[$j]} dialed by ${SITES[$dialer]}"
done
log "stream_up per site: ${before[*]}"
mesh_stop

# A site that only dials out, behind NAT that lets nothing in: its peers
# have no address for it. site-c dials the others' as usual.
K=3
closed=$(free_ports 1)
DIAL=([1-0]=out [1-2]=out [0-1]=in [2-1]=in)
PEER_ADDR=([0-1]=none [2-1]=none)
mesh_start
mesh_up 15
run_ok dial-out-only 100003 1 2
for i in 0 2; do
	expect "$(site_log "$i")" 'event=stream_up site=site-b stream=0 dialed_by=site-b ' "${SITES[$i]}: site-b dialed"
done
"$GRADGATE" status --control "unix:$work/site-a.sock" >"$work/nat.out" 2>&1 || fail "status: $(cat "$work/nat.out")"
expect "$work/nat.out" '^site-b +- +2/2 ' "site-a's status of site-b, which has no address there"
"$GRADGATE" status --control "unix:$work/site-a.sock" --json >"$work/nat.json" 2>&1 || fail "status --json failed"
python3 -c 'import json, sys; p = [p for p in json.load(open(sys.argv[1]))["peers"] if p["site"] == "site-b"]; sys.exit(not (len(p) == 1 and p[0]["address"] is None))' \
	"$work/nat.json" || fail "site-b's address in the status JSON is not null: $(cat "$work/nat.json")"
log "a site behind NAT, as its peers see it: $(grep '^site-b' "$work/nat.out")"
mesh_stop
PEER_ADDR=([0-1]=127.0.0.1:$closed [2-1]=127.0.0.1:$closed)

# The same firewall with "both" at its peers: their dials fail (the closed
# port), site-b's carry the streams.
DIAL=([1-0]=out [1-2]=out)
mesh_start
mesh_up 15
run_ok dial-out-only-both 100003 1 2
mesh_stop
PEER_ADDR=()
K=2

# Both "in": nobody dials. Each site says, heartbeat_timeout after its
# start, that the mesh is incomplete and why, and a step fails naming the
# settings.
DIAL=([0-1]=in [1-0]=in)
mesh_start
both_say nobody_dials "that nobody dials"
step_fails waits 'site site-b is unreachable: .*dial for site-b is "in", so site-b must dial it \(dial = "out" or "both" there\)' \
	"in/in, the step"
expect_none_now 0 'event=(stream_up|mesh_up)' "in/in"
# The failure as the host backend logs it: one value, its quotes escaped.
expect "$(site_log 0)" 'event=control msg="job .* is \\"in\\", so site-b must dial it \(dial = \\"out\\" or \\"both\\" there\)' \
	"in/in, the control line"
expect_none_now 0 'event=control .*[^\\]"in"' "in/in, a control line with its quotes unescaped"
log "in/in: $(since_start "$(site_log 0)" | grep -m1 -o 'event=mesh_degraded.*')"
mesh_stop

# Both "out": each dials, each refuses the other, each says so.
DIAL=([0-1]=out [1-0]=out)
mesh_start
both_say conflict "what the conflict is"
both_say refused "that it refused the other's streams"
for i in 0 1; do
	expect_none_now "$i" 'event=(stream_up|mesh_up)' "out/out"
done
step_fails conflict "site site-b is unreachable: .*dial conflict: each site's \[\[peers\]\] dial for the other is \"out\"" \
	"out/out, the step"
log "out/out: $(since_start "$(site_log 0)" | grep -m1 -o 'event=dial_refused.*')"
mesh_stop

# site-b only dials (dial = "out"), but at a closed port: its address for
# site-a is wrong. site-a, whose dials site-b refuses, says what keeps
# them apart: not "never connected", nor a dial of its own that failed.
DIAL=([1-0]=out)
PEER_ADDR=([1-0]=127.0.0.1:$(free_ports 1))
mesh_start
step_fails wa 'site site-b is unreachable: .*never connected: site site-b refuses our dials \(dial "out" there\) and its own do not arrive \(its address for site-a' \
	"a site that dials out at a wrong address, the step"
mesh_stop
PEER_ADDR=()

# site-b presents site-c's certificate, and only site-a dials: each of
# its dials is refused, and the incomplete mesh and a step that waits for
# it name the certificate, not "never connected".
certs=$work/certs
for ext in pem key; do
	mv "$certs/site-b.$ext" "$certs/site-b.$ext.real"
	cp -p "$certs/site-c.$ext" "$certs/site-b.$ext"
done
DIAL=([0-1]=out [1-0]=in)
mesh_start
bad_cert="peer 127\.0\.0\.1:[0-9]+: certificate does not name site 'site-b' \(expected identity dns:site-b\.gradgate\.test; sent alert bad_certificate; certificate names dns:site-c\.gradgate\.test"
wait_for_since "$(site_log 0)" "event=mesh_degraded site=site-a unreachable=1 reason=\"site site-b: $bad_cert" 10 ||
	fail "site-a's mesh_degraded did not name site-b's certificate"
# (The rank's message, at most 255 bytes, holds the reason's start.)
step_fails badcert "site site-b is unreachable: .*its streams are down: peer 127\.0\.0\.1:[0-9]+: certificate does not name site 'site-b' " \
	"a peer's wrong certificate, the step"
mesh_stop
for ext in pem key; do
	mv "$certs/site-b.$ext.real" "$certs/site-b.$ext"
done

# A peer of another release (protocol version 9) that dials in: site-a
# answers with its own HELLO (in which a gateway that dialed would read the
# cause too), logs peer_mismatch naming both versions, and a step that
# waits for site-b names it, not the dial setting.
DIAL=([0-1]=in)
read -r -a gw_port <<<"$(free_ports 2)"
write_config 0
gw_start 0 || fail "site-a could not listen on ${gw_port[0]}"
# old_release: a connection to site-a with site-b's certificate whose
# first message is of protocol version 9.
old_release() {
	{ printf 'GGW1\001\011\000\000\000\000\000\000'; sleep 1; } |
		timeout 10 openssl s_client -connect "127.0.0.1:${gw_port[0]}" -CAfile "$certs/ca.pem" \
			-cert "$certs/site-b.pem" -key "$certs/site-b.key" -alpn gradgate/1 \
			-servername site-a.gradgate.test -quiet >"$work/old-release.out" 2>&1 || true
	grep -aq 'GGW1' "$work/old-release.out" || fail "site-a did not answer the other release's HELLO with its own"
}
old_release
mismatch="site site-b runs another gradgate release \\(protocol version 9, this gateway speaks 10\\): every site must run the same one; upgrade them together"
wait_for "$(site_log 0)" "level=error event=peer_mismatch site=site-b reason=\"$mismatch\"" 5 ||
	fail "site-a did not log the other release at error level"
# (The rank's message, at most 255 bytes, holds the reason's start.)
step_fails release "site site-b is unreachable: .*its streams are down: site site-b runs another gradgate release \\(protocol version 9" \
	"a peer of another release, the step"
# With site-b's own streams up, such a connection in its name changes
# nothing but the log: both streams stay up.
write_config 1
gw_start 1 || fail "site-b could not start"
wait_streams 0 1 2 10 "with both streams up"
old_release # (answered: refused)
"$GRADGATE" status --control "unix:$work/site-a.sock" >"$work/release-up.out" 2>&1 || fail "status failed"
expect "$work/release-up.out" '^site-b +[^ ]+ +2/2 ' "site-b's streams, still up after a refused connection in its name"
gw_stop 1
gw_stop 0
DIAL=()

# site-b refuses site-a inbound (dial = "out" for it): a client with
# site-a's valid certificate is told so with an alert, not a silent close;
# a certificate of a site site-b does not know gets bad_certificate.
DIAL=([1-0]=out)
make_certs
read -r -a gw_port <<<"$(free_ports 2)"
write_config 1
gw_start 1 || fail "site-b could not listen on ${gw_port[1]}"
for who in site-a site-c; do
	timeout 10 openssl s_client -connect "127.0.0.1:${gw_port[1]}" -CAfile "$certs/ca.pem" \
		-cert "$certs/$who.pem" -key "$certs/$who.key" -alpn gradgate/1 \
		-servername site-b.gradgate.test -ign_eof </dev/null >"$work/client-$who.out" 2>&1 || true
done
expect "$work/client-site-a.out" 'alert access denied' "s_client as site-a saw access_denied"
expect "$work/client-site-c.out" 'alert bad certificate' "s_client as site-c saw bad_certificate"
wait_for "$(site_log 1)" "event=stream_refused site=site-a dial=out reason=\"site site-a dialed this site, whose \[\[peers\]\] dial for it is \\\\\"out\\\\\"" 5 ||
	fail "site-b did not log the refused peer"
expect "$(site_log 1)" "stream_down site=\? stream=-1 reason=\"peer 127\.0\.0\.1:[0-9]+: site 'site-a' may not open connections to this site .*sent alert access_denied" \
	"site-b's reason for site-a"
expect "$(site_log 1)" "stream_down site=\? stream=-1 reason=\"peer 127\.0\.0\.1:[0-9]+: certificate names no site known here .*sent alert bad_certificate; certificate names dns:site-c.gradgate.test" \
	"site-b's reason for site-c"
log "s_client as site-a: $(grep -m1 -o '.*alert access denied.*' "$work/client-site-a.out")"
gw_stop 1
DIAL=()

# Both dial: started together, each dials every stream at once. The pair
# settles on site-a's connections; whichever duplicate came up is closed
# with its reason.
mesh_start
mesh_up 15
wait_settled 0 1 0 5 || fail "both/both: streams not all dialed by site-a"
run_ok together 1000003 1 2
for i in 0 1; do
	since_start "$(site_log "$i")"
done | grep -E 'event=stream_down .*reason="duplicate stream: ' >"$work/duplicates.out" || true
for i in 0 1; do
	[ "$(ups "$i")" -le $((2 * STREAMS)) ] || fail "${SITES[$i]} brought up $(ups "$i") streams for $STREAMS"
	expect_none_now "$i" 'event=(step_failed|mesh_degraded)' "both/both"
	# A duplicate closed at either end is no warning.
	expect_none_now "$i" 'level=warn event=stream_down' "both/both"
done
# Whether both dials of a stream meet is the start's timing (site-b's own
# may come once site-a's is up, and then it does not dial); mesh-streams'
# duplicates case makes them meet every time.
if [ -s "$work/duplicates.out" ]; then
	log "both/both: $(wc -l <"$work/duplicates.out") duplicates closed, as: $(head -n 1 "$work/duplicates.out" |
		grep -o 'event=.*')"
else
	log "both/both: no two dials met"
fi
mesh_stop

# Both dial, and site-a's connections cross a link that resets every one
# of them in the middle of a job: both sites redial, the pair settles on
# site-a's again, and the steps are exact.
DIAL=([0-1]=both [1-0]=both)
LINK_ARGS=(--rate 100mbit --report-every 1MiB)
mesh_start
mesh_up 15
wait_settled 0 1 0 5 || fail "both/both over a link: streams not all dialed by site-a"
before=$(ups 0)
ranks_start reset 1000003 1 3
wait_for "$work/link-0-1.log" "connection [0-9]+ (up|down) [0-9]+ bytes" 10 || fail "no data crossed the link"
kill -USR1 "${link_pid[01]}"
check_ranks
wait_for "$work/link-0-1.log" "reset [1-9][0-9]* connections? on request" 5 || fail "linkem reset nothing"
wait_settled 0 1 0 5 || fail "both/both after the reset: streams not all dialed by site-a"
for i in 0 1; do
	expect_none_now "$i" 'event=step_failed' "both/both, reset"
done
[ $(($(ups 0) - before)) -le $((2 * STREAMS)) ] || fail "site-a brought up $(($(ups 0) - before)) streams after the reset"
log "both/both, reset: site-a brought up $(($(ups 0) - before)) streams again; digest $checked_digest"
mesh_stop
