#!/usr/bin/env bash
# The metrics endpoint of two gateways: a page that Prometheus reads
# (checked strictly here, and by promtool where it is installed) with every
# family, counters that grew as the steps did and agree between the sites
# and with the 'stopped' lines, and an endpoint that refuses what it does
# not serve: other paths, other methods, oversized, malformed and slow
# requests, too many connections; and a config that would open it to the
# network unasked.
. "$(dirname "$0")/lib.sh"

command -v curl >/dev/null || fail "curl is needed: apt-get install curl"
prom="python3 $(dirname "$0")/prom_text.py"

families=(gradgate_build_info gradgate_start_time_seconds gradgate_steps_completed_total
	gradgate_step_failures_total gradgate_step_duration_seconds gradgate_step_phase_seconds_total
	gradgate_raw_bytes_total gradgate_encoded_bytes_total gradgate_wire_bytes_total gradgate_compression_ratio
	gradgate_peer_rtt_seconds gradgate_peer_delivery_rate_bytes_per_second gradgate_peer_streams_up
	gradgate_peer_stream_ups_total gradgate_peer_stream_downs_total gradgate_peer_last_heard_timestamp_seconds
	gradgate_stream_failures_total gradgate_resent_messages_total gradgate_hedged_frames_total gradgate_tls_seconds_total
	gradgate_memory_bytes gradgate_memory_limit_bytes gradgate_jobs gradgate_sessions
	gradgate_stream_rtt_seconds gradgate_stream_rtt_variation_seconds gradgate_stream_cwnd_bytes
	gradgate_stream_delivery_rate_bytes_per_second gradgate_stream_retransmitted_segments_total
	gradgate_stream_unsent_bytes gradgate_stream_send_buffer_bytes gradgate_stream_receive_buffer_bytes)

# scrape I NAME: site I's page into $work/NAME.prom (headers in NAME.head),
# checked strictly; its samples in NAME.tsv for val.
scrape() {
	local f="$work/$2.prom"
	curl -sS --max-time 10 -D "$work/$2.head" -o "$f" "http://127.0.0.1:${metrics_port[$1]}/metrics" ||
		fail "scraping ${SITES[$1]} failed"
	grep -q '^HTTP/1.1 200 ' "$work/$2.head" || fail "${SITES[$1]} answered $(head -n1 "$work/$2.head")"
	grep -qi '^Content-Type: text/plain; version=0.0.4' "$work/$2.head" ||
		fail "${SITES[$1]}'s page is not text/plain; version=0.0.4: $(grep -i '^content-type' "$work/$2.head")"
	$prom table "$f" >"$work/$2.tsv" || fail "${SITES[$1]}'s page is not valid exposition format"
	if command -v promtool >/dev/null; then
		promtool check metrics <"$f" >"$work/$2.promtool" 2>&1 ||
			fail "promtool: $(cat "$work/$2.promtool")"
	fi
}

# val NAME SERIES: one series' value from a scrape, the series spelled as
# the page spells it.
val() {
	local v
	v=$(awk -F '\t' -v s="$2" '$1 == s { print $2; found = 1; exit } END { exit !found }' "$work/$1.tsv") ||
		fail "$1 has no series $2"
	echo "$v"
}

# within LOW X HIGH: LOW < X < HIGH as numbers.
within() { awk -v a="$1" -v x="$2" -v b="$3" 'BEGIN { exit !(a < x && x < b) }'; }

# eq WHAT A B: A and B must be equal.
eq() { [ "$2" = "$3" ] || fail "$1: $2, expected $3"; }

# ---- a non-loopback listen is refused at load, naming file:line and key
K=2
make_certs
gw_port[0]=7101
metrics_port[0]=9464
gw_port[1]=7102
write_config 0
printf '\n[metrics]\nlisten = "0.0.0.0:9464"\n' >>"$work/site-a.toml"
line=$(grep -n '^listen = "0.0.0.0:9464"' "$work/site-a.toml" | cut -d: -f1)
rc=0
"$GRADGATE" --config "$work/site-a.toml" >"$work/remote.out" 2>&1 || rc=$?
eq "gradgate with a non-loopback [metrics] listen exits" "$rc" 1
expect "$work/remote.out" "site-a.toml:$line:10: 'listen' in \[metrics\] is 0.0.0.0:9464, not a loopback address; .*allow_remote = true" \
	"the refusal"
log "refused: $(head -n1 "$work/remote.out")"
printf 'allow_remote = true\n' >>"$work/site-a.toml"
"$GRADGATE" --check-config "$work/site-a.toml" >"$work/remote.out" 2>&1 ||
	fail "allow_remote = true is refused: $(cat "$work/remote.out")"

# ---- two gateways with metrics on
METRICS=1
CODEC=bf16
ALGO=ring
COUNT=100003
STEPS=5
mesh_start
mesh_up 15
for i in 0 1; do
	expect "$(site_log "$i")" "event=started .*metrics=http://127.0.0.1:${metrics_port[$i]}/metrics" "${SITES[$i]}'s start"
done
scrape 0 a0
awk '/^# TYPE / { print $3 }' "$work/a0.prom" >"$work/families"
for f in "${families[@]}"; do
	grep -qx "$f" "$work/families" || fail "family $f is missing"
done
eq "families on the page" "$(wc -l <"$work/families")" "${#families[@]}"
eq "steps before any" "$(val a0 gradgate_steps_completed_total)" 0
eq "compression ratio before any frame" "$(val a0 gradgate_compression_ratio)" nan
eq "build info" "$(val a0 'gradgate_build_info{version="'"$("$GRADGATE" --version | sed -n '1s/^gradgate //p')"'",site="site-a"}')" 1

run_ok steps "$COUNT" 1 "$STEPS"
# The lanes publish their figures at their next turn; a round trip is
# measured by the site whose stream fell idle for heartbeat_interval (500
# ms) first. Heartbeats keep adding wire bytes, which the checks below
# allow for.
deadline=$((EPOCHSECONDS + 15))
# (No pipe into grep -q: under pipefail, curl's SIGPIPE would read as no match.)
until grep -q '^gradgate_peer_rtt_seconds{' <<<"$(curl -s --max-time 5 "http://127.0.0.1:${metrics_port[0]}/metrics" \
	"http://127.0.0.1:${metrics_port[1]}/metrics")"; do
	[ "$EPOCHSECONDS" -lt "$deadline" ] || fail "neither site measured a round trip within 15 s"
	sleep 0.1
done
scrape 0 a1
scrape 1 b1

raw=$((COUNT * 4 * STEPS)) # each site sends every element once per step (2 sites, either algorithm)
for s in a1 b1; do
	eq "$s steps completed" "$(val $s gradgate_steps_completed_total)" "$STEPS"
	eq "$s steps in the duration histogram" "$(val $s gradgate_step_duration_seconds_count)" "$STEPS"
	eq "$s steps failed" "$(val $s 'gradgate_step_failures_total{code="GG_ERR_TIMEOUT"}')" 0
	eq "$s steps failed" "$(val $s 'gradgate_step_failures_total{code="GG_ERR_SITE"}')" 0
	eq "$s jobs after the ranks left" "$(val $s gradgate_jobs)" 0
	eq "$s memory limit" "$(val $s gradgate_memory_limit_bytes)" $((2 << 30))
done
eq "site-a raw bytes sent" "$(val a1 'gradgate_raw_bytes_total{peer="site-b",direction="sent"}')" "$raw"
eq "site-b raw bytes sent" "$(val b1 'gradgate_raw_bytes_total{peer="site-a",direction="sent"}')" "$raw"
for dir in "a1 b1 site-b site-a" "b1 a1 site-a site-b"; do
	read -r from to peer_of_from peer_of_to <<<"$dir"
	for fam in gradgate_raw_bytes_total gradgate_encoded_bytes_total; do
		eq "$fam: $from sent and $to received" \
			"$(val "$from" "$fam{peer=\"$peer_of_from\",direction=\"sent\"}")" \
			"$(val "$to" "$fam{peer=\"$peer_of_to\",direction=\"received\"}")"
	done
	sent=$(val "$from" "gradgate_wire_bytes_total{peer=\"$peer_of_from\",direction=\"sent\"}")
	got=$(val "$to" "gradgate_wire_bytes_total{peer=\"$peer_of_to\",direction=\"received\"}")
	enc=$(val "$from" "gradgate_encoded_bytes_total{peer=\"$peer_of_from\",direction=\"sent\"}")
	diff=$((sent > got ? sent - got : got - sent))
	[ "$diff" -le 16384 ] || fail "wire bytes $from sent ($sent) and $to received ($got) differ by $diff"
	[ "$sent" -gt "$enc" ] || fail "$from's wire bytes ($sent) are not above its encoded bytes ($enc)"
done
ratio=$(val a1 gradgate_compression_ratio)
enc=$(val a1 'gradgate_encoded_bytes_total{peer="site-b",direction="sent"}')
python3 -c "import sys; r, want = float('$ratio'), $raw / $enc; sys.exit(abs(r - want) > 1e-6 * want or r < 1.5)" ||
	fail "compression ratio $ratio, expected $raw/$enc (bf16: about 2)"
eq "streams up" "$(val a1 'gradgate_peer_streams_up{peer="site-b"}')" "$STREAMS"
# Where both sites dial, a stream may come up twice (the duplicate is
# closed): what came up and did not go down is what is up.
ups=$(val a1 'gradgate_peer_stream_ups_total{peer="site-b"}') downs=$(val a1 'gradgate_peer_stream_downs_total{peer="site-b"}')
[ "$ups" -ge "$STREAMS" ] || fail "streams that came up: $ups, fewer than the $STREAMS streams"
eq "streams that came up and did not go down" "$((ups - downs))" "$STREAMS"
grep -q '^gradgate_peer_rtt_seconds{peer="site-b"} [0-9.e-]*$' "$work/a1.prom" ||
	grep -q '^gradgate_peer_rtt_seconds{peer="site-a"} [0-9.e-]*$' "$work/b1.prom" || fail "no round trip on the pages"
# Every stream's TCP figures, at both ends: a round trip and a window.
for end in "a1 site-b" "b1 site-a"; do
	read -r page peer <<<"$end"
	for ((st = 0; st < STREAMS; st++)); do
		rtt=$(val "$page" "gradgate_stream_rtt_seconds{peer=\"$peer\",stream=\"$st\"}")
		cwnd=$(val "$page" "gradgate_stream_cwnd_bytes{peer=\"$peer\",stream=\"$st\"}")
		within 0 "$rtt" 1 && [ "$cwnd" -gt 0 ] ||
			fail "$page: stream $st to $peer: rtt $rtt s, cwnd $cwnd bytes"
		# socket_buffer = 1MiB: the kernel counts twice that, whatever
		# net.core.*mem_max says when the gateway may pass it (root).
		for dir in send receive; do
			buf=$(val "$page" "gradgate_stream_${dir}_buffer_bytes{peer=\"$peer\",stream=\"$st\"}")
			[ "$(id -u)" != 0 ] || [ "$buf" = $((2 << 20)) ] ||
				fail "$page: stream $st to $peer: $dir buffer $buf bytes, not twice socket_buffer = 1MiB"
		done
	done
	eq "$page: streams with TCP figures" "$(grep -c "^gradgate_stream_rtt_seconds{peer=\"$peer\"," "$work/$page.prom")" \
		"$STREAMS"
done
for phase in gather encode network_wait decode deliver; do
	val a1 "gradgate_step_phase_seconds_total{phase=\"$phase\"}" >/dev/null
done
python3 - "$work/a0.prom" "$work/a1.prom" <<'PY' || fail "a counter went down between two scrapes"
import re, sys
def counters(path):
    kinds, out = {}, {}
    for line in open(path):
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            kinds[name] = kind
        elif not line.startswith("#"):
            series, value = line.rsplit(" ", 1)
            name = re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", series).group(0)
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            if kinds.get(name) == "counter" or kinds.get(base) == "histogram":
                out[series] = float(value)
    return out
before, after = counters(sys.argv[1]), counters(sys.argv[2])
down = [s for s in before if s in after and after[s] < before[s]]
print("\n".join(down))
sys.exit(1 if down else 0)
PY
log "counters agree: $raw raw bytes and $enc encoded bytes each way, compression ratio $ratio"

# ---- what the endpoint refuses
base="http://127.0.0.1:${metrics_port[0]}"
code() { curl -s --max-time 10 -o "$work/body" -w '%{http_code}' "$@"; }
eq "GET /other" "$(code "$base/other")" 404
eq "GET /metrics/" "$(code "$base/metrics/")" 404
eq "POST /metrics" "$(code -X POST --data x "$base/metrics")" 405
curl -s --max-time 10 -D "$work/post.head" -o /dev/null -X POST "$base/metrics"
grep -qi '^Allow: GET, HEAD' "$work/post.head" || fail "405 without Allow: GET, HEAD"
eq "GET /metrics?x=1" "$(code "$base/metrics?x=1")" 200
eq "HEAD /metrics: status and body bytes" "$(curl -s --max-time 10 -I -o /dev/null -w '%{http_code} %{size_download}' \
	"$base/metrics")" "200 0"
pad=$(head -c 9000 /dev/zero | tr '\0' a)
eq "a 9000-byte header" "$(code -H "X-Pad: $pad" "$base/metrics")" 431
python3 - "${metrics_port[0]}" <<'PY' || fail "the endpoint answered a raw request wrongly"
import socket, sys, time
port = int(sys.argv[1])

def ask(data, wait=10.0, half_close=False):
    s = socket.create_connection(("127.0.0.1", port), timeout=wait)
    if data:
        s.sendall(data)
    if half_close:
        s.shutdown(socket.SHUT_WR)
    got = b""
    while True:
        try:
            chunk = s.recv(65536)
        except (socket.timeout, ConnectionResetError):
            break
        if not chunk:
            break
        got += chunk
    s.close()
    return got.split(b"\r\n", 1)[0].decode(errors="replace")

cases = [
    (b"GET /metrics HTTP/1.1\r\n\r\n", "400"),                        # no Host
    (b"GET /metrics HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", "400"),   # two
    (b"GET  /metrics HTTP/1.1\r\nHost: a\r\n\r\n", "400"),
    (b"GET /metrics HTTP/1.1\r\nHost : a\r\n\r\n", "400"),
    (b"GET /metrics HTTP/1.1\r\nHost: a\r\n folded\r\n\r\n", "400"),
    (b"GET /metrics HTTP/1.1\r\nHost: a\x01\r\n\r\n", "400"),
    (b"GET /metrics HTTP/1.1\nHost: a\r\n\r\n", "400"),
    (b"GET /metrics HTTP/1.0\n\n", "400"),                               # never CRLF CRLF: at once
    (b"GET /metrics HTTP/1.0\r\nHost: a\rb", "400"),
    (b"GET metrics HTTP/1.1\r\nHost: a\r\n\r\n", "400"),
    (b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03\r\n\r\n", "400"),  # TLS where HTTP is expected
    (b"GET /metrics HTTP/2.0\r\nHost: a\r\n\r\n", "505"),
    (b"GET /metrics HTTP/1.0\r\n\r\n", "200"),
    (b"GET http://x/metrics HTTP/1.1\r\nHost: x\r\n\r\n", "200"),
    (b"DELETE /metrics HTTP/1.1\r\nHost: a\r\n\r\n", "405"),
    (b"OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n", "405"),
    (b"\r\n\r\nGET /metrics HTTP/1.1\r\nHost: a\r\n\r\n", "200"),       # empty lines first: passed over
    (b"GET /metrics HTTP/1.1\r\nHost: a b\r\n\r\n", "400"),
    (b"GET /metrics HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n", "400"),
    (b"GET /metrics HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n", "400"),
]
bad = 0
for req, want in cases:
    line = ask(req)
    if not line.startswith("HTTP/1.1 " + want):
        print(f"{req!r}: {line!r}, expected {want}")
        bad += 1
# A request cut short by its client (which ends its side) is answered
# 400 at once.
t0 = time.monotonic()
line = ask(b"GET /metrics HTTP/1.1\r\nHost: a\r\n", wait=5, half_close=True)
if not line.startswith("HTTP/1.1 400") or time.monotonic() - t0 > 2:
    print(f"a request cut short: {line!r} after {time.monotonic() - t0:.1f} s, expected 400 at once")
    bad += 1
# A request that never ends is answered 408 once the timeout passed.
t0 = time.monotonic()
line = ask(b"GET /metrics HTTP/1.1\r\nHost: a\r\n", wait=15)
if not line.startswith("HTTP/1.1 408") or time.monotonic() - t0 > 8:
    print(f"slow request: {line!r} after {time.monotonic() - t0:.1f} s, expected 408 within 8 s")
    bad += 1
# Connections beyond the bound are refused at once, before they said
# anything (a request already sent may meet a reset instead); those within
# the bound wait.
idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(8)]
time.sleep(0.2)
line = ask(b"", wait=5)
if not line.startswith("HTTP/1.1 503"):
    print(f"a ninth connection: {line!r}, expected 503")
    bad += 1
for s in idle:
    s.close()
time.sleep(0.3)
line = ask(b"GET /metrics HTTP/1.1\r\nHost: a\r\n\r\n", wait=5)
if not line.startswith("HTTP/1.1 200"):
    print(f"after the idle connections closed: {line!r}, expected 200")
    bad += 1
sys.exit(1 if bad else 0)
PY
eq "a scrape after all that" "$(code "$base/metrics")" 200
log "refused: other paths (404), POST and OPTIONS (405), 9000-byte header (431), malformed, cut short or of" \
	"untold body length (400), HTTP/2.0 (505), slow (408), a ninth connection (503)"

# ---- the stopped lines say what the page said
scrape 0 a2
scrape 1 b2
mesh_stop
for s in "0 a2 site-b" "1 b2 site-a"; do
	read -r i page peer <<<"$s"
	expect "$(site_log "$i")" "event=stopped site=${SITES[$i]} steps_done=$STEPS steps_failed=0 raw_bytes_out=$(val "$page" \
		"gradgate_raw_bytes_total{peer=\"$peer\",direction=\"sent\"}") wire_bytes_out=$(val "$page" \
		"gradgate_encoded_bytes_total{peer=\"$peer\",direction=\"sent\"}") " "${SITES[$i]}'s stopped line"
done

# ---- a stream that comes up has its TCP figures on the first page that
# counts it up: its lane reads them as it comes up, not at its next
# quarter second. Site-a's page, read over and over while site-b starts
# again. (The two are published one after the other: a page between them
# is read again.)
streams_and_figures() {
	local page
	page=$(curl -s --max-time 2 "http://127.0.0.1:${metrics_port[0]}/metrics") || return 1
	echo "$(awk '$1 == "gradgate_peer_streams_up{peer=\"site-b\"}" { print $2 }' <<<"$page")" \
		"$(grep -c '^gradgate_stream_rtt_seconds{peer="site-b",' <<<"$page" || true)"
}
gw_start 0
gw_launch 1
deadline=$((EPOCHSECONDS + 15)) pages=0 seen=0
while :; do
	[ "$EPOCHSECONDS" -lt "$deadline" ] || fail "site-a's page did not count $STREAMS streams up within 15 s"
	if ! read -r up figures < <(streams_and_figures) || [ -z "$up" ]; then
		sleep 0.01
		continue
	fi
	pages=$((pages + 1))
	if [ "$up" != "$figures" ]; then
		sleep 0.05
		read -r up figures < <(streams_and_figures) || continue
		eq "streams up, and those with TCP figures" "$figures" "$up"
	fi
	[ "$up" = 0 ] || seen=$((seen + 1))
	[ "$up" != "$STREAMS" ] || break
done
gw_started 1
log "every stream up had its TCP figures on each of $pages pages read as site-b came back ($seen with streams up)"
mesh_stop

# ---- failures counted by their cause: a step past its deadline (site-b
# has no rank for it) at site-a; a dial refused for the dial setting at the
# site that refuses it; streams of a peer with another codec, at both.
gw_start 0
gw_start 1
mesh_up 15
rank_start late 1000 0 1 0 1 --timeout-ms 500
ranks_wait
eq "the rank of a step site-b has no rank for exits" "${rank_rc[late-s0-r0]}" 1
scrape 0 a3
eq "site-a's steps failed by their deadline" "$(val a3 'gradgate_step_failures_total{code="GG_ERR_TIMEOUT"}')" 1
eq "site-a's steps failed for a site" "$(val a3 'gradgate_step_failures_total{code="GG_ERR_SITE"}')" 0
mesh_stop
# failures SITE REASON: site SITE's count of streams that never came up
# for REASON.
failures() {
	curl -s --max-time 5 "http://127.0.0.1:${metrics_port[$1]}/metrics" |
		awk -v s="gradgate_stream_failures_total{reason=\"$2\"}" '$1 == s { print $2 }'
}
# wait_failures SITE REASON: until SITE counted one.
wait_failures() {
	local deadline=$((EPOCHSECONDS + 15)) n
	until n=$(failures "$1" "$2") && [ "${n:-0}" -ge 1 ]; do
		[ "$EPOCHSECONDS" -lt "$deadline" ] || fail "${SITES[$1]} counted no '$2' stream failure within 15 s"
		sleep 0.2
	done
}
DIAL["0-1"]=out
DIAL["1-0"]=both
write_config 0
write_config 1
gw_start 0
gw_start 1
wait_failures 0 denied
eq "denied at site-b, whose dials site-a refuses" "$(failures 1 denied)" 0
denied=$(failures 0 denied)
mesh_stop
unset 'DIAL[0-1]' 'DIAL[1-0]'
SITE_CODEC[1]=int8
write_config 0
write_config 1
gw_start 0
gw_start 1
wait_failures 0 mismatch
wait_failures 1 mismatch
log "failures counted: GG_ERR_TIMEOUT 1 at site-a; denied $denied at site-a, 0 at site-b;" \
	"mismatch $(failures 0 mismatch) at site-a, $(failures 1 mismatch) at site-b"
mesh_stop
