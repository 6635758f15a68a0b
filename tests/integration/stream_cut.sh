#!/usr/bin/env bash
# TCP streams cut mid-transfer by linkem: the frames they carried go out
# again once a stream is back, and the step completes at every site with
# identical results, whichever way the streams were cut.
. "$(dirname "$0")/lib.sh"

K=3
ALGO=ring
CODEC=fp32
LINK_ARGS=(--report-every 1MiB)
# The first stream from site-a to site-b is reset after 1.5 MiB, in the
# middle of the first big step (about 4 MB cross each link).
LINK_EXTRA[0-1]="--cut-after-bytes 1572864 --cut-count 1"
mesh_start
mesh_up 15
run_ok cut 1000003 2 2
expect "$work/link-0-1.log" "reset after 1572864 bytes: cut after bytes" "linkem cut a stream"
expect "$(site_log 0)" "event=stream_down site=site-b" "site-a saw its stream to site-b cut"
expect "$(site_log 1)" "event=stream_down site=site-a" "site-b saw its stream from site-a cut"
wait_for "$(site_log 0)" "event=mesh_up" 10 || fail "site-a did not reconnect"
mesh_stop
resent=0
for n in $(sed -n 's/.*event=stopped .*resent_messages=\([0-9]*\).*/\1/p' "$work"/gw-*.log); do
	resent=$((resent + n))
done
[ "$resent" -gt 0 ] || fail "no site re-sent anything after the cut"
log "messages re-sent after the cut: $resent"

# SIGUSR1: linkem resets every connection it forwards, on every link, in
# the middle of a job whose steps the rate limit stretches to ~0.2 s each.
LINK_ARGS=(--rate 100mbit --report-every 1MiB)
LINK_EXTRA=()
mesh_start
mesh_up 15
ranks_start reset 1000003 1 3
wait_for "$work/link-1-2.log" "connection [0-9]+ (up|down) [0-9]+ bytes" 10 || fail "no data crossed site-b -> site-c"
for k in "${!link_pid[@]}"; do
	kill -USR1 "${link_pid[$k]}"
done
log "reset the connections of every link"
check_ranks
for k in "${!link_pid[@]}"; do
	wait_for "$work/link-${k:0:1}-${k:1:1}.log" "reset [1-9][0-9]* connections? on request" 5 ||
		fail "linkem ${k:0:1}-${k:1:1} reset nothing"
done
for ((i = 0; i < K; i++)); do
	expect_none "$(site_log "$i")" 'event=step_failed' "${SITES[$i]}"
done
mesh_stop
