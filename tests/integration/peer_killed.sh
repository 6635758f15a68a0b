#!/usr/bin/env bash
# A peer gateway killed (SIGKILL) mid-step: the ranks of every other site
# get an error naming the dead site and the step, within step_timeout; the
# killed site's own ranks lose their gateway. After the gateway restarts,
# its peers see a new instance and a new job works at every site.
. "$(dirname "$0")/lib.sh"

K=3
STEP_TIMEOUT=3s
# Direct exchange: every site needs all of site-b's 16 MB (about 8 MB on
# the wire). The links to and from site-b are slow (20 Mbit/s) with small
# buffers, and report every MiB site-b sends: the kill lands once both
# peers have some of site-b's data and neither can have all of it.
ALGO=direct
COUNT=4194304
SOCKET_BUFFER=64KiB
LINK_ARGS=(--buffer 512KiB --socket-buffer 128KiB)
LINK_EXTRA[0-1]="--rate 20mbit --report-every 1MiB"
LINK_EXTRA[1-2]="--rate 20mbit --report-every 1MiB"
mesh_start
mesh_up 15
run_ok warm 1000 1 1

# Sites a and c announce the step first and wait for site b's data; b's
# rank joins last, and its gateway dies once that rank is connected.
ranks_start doomed $COUNT 1 1 0 2
wait_for "$(site_log 0)" "rank 0 of job 'doomed' connected" 10 || fail "site-a's rank did not connect"
wait_for "$(site_log 2)" "rank 0 of job 'doomed' connected" 10 || fail "site-c's rank did not connect"
ranks_start doomed $COUNT 1 1 1
wait_for "$work/link-0-1.log" "connection [0-9]+ down [0-9]+ bytes" 10 || fail "site-b sent no data to site-a"
wait_for "$work/link-1-2.log" "connection [0-9]+ up [0-9]+ bytes" 10 || fail "site-b sent no data to site-c"
killed_at=${EPOCHREALTIME/[.,]/}
gw_stop 1 KILL
[ "$reaped" = 137 ] || fail "site-b's gateway exited $reaped, not by SIGKILL"
log "killed site-b's gateway"
ranks_wait
waited_ms=$(((${EPOCHREALTIME/[.,]/} - killed_at) / 1000))
log "every rank finished ${waited_ms} ms after the kill"
# step_timeout (3 s) plus the time a rank takes to hear of it.
[ "$waited_ms" -lt 6000 ] || fail "the ranks took ${waited_ms} ms to fail; step_timeout is 3 s"

for s in 0 2; do
	name=doomed-s$s-r0
	[ "${rank_rc[$name]}" = 1 ] || fail "$name exited ${rank_rc[$name]}, expected 1"
	expect "$work/$name.err" "step 1 .*site-b" "$name's error names site-b and step 1"
	expect "$(site_log "$s")" "event=step_failed job=doomed step=1 .*site-b" "${SITES[$s]}'s log names site-b"
	expect "$(site_log "$s")" "event=stream_down site=site-b" "${SITES[$s]} saw site-b's streams go"
	log "${SITES[$s]}'s rank: $(cat "$work/$name.err")"
done
[ "${rank_rc[doomed-s1-r0]}" = 1 ] || fail "site-b's rank exited ${rank_rc[doomed-s1-r0]}, expected 1"
expect "$work/doomed-s1-r0.err" "closed the connection|connection to the gateway|lost" \
	"site-b's rank reports its lost gateway"

# The same gateway comes back (a new instance id): its peers notice, and
# the mesh carries a new job at every site.
gw_start 1
mesh_up 15
for s in 0 2; do
	wait_for "$(site_log "$s")" "event=peer_restarted site=site-b" 5 ||
		fail "${SITES[$s]} did not notice that site-b restarted"
done
run_ok after 100003 1 2
mesh_stop
