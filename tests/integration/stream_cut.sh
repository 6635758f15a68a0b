#!/usr/bin/env bash
# TCP streams cut mid-transfer by linkem: the frames they carried go out
# again once a stream is back, and the step completes at every site with
# identical results, whichever way the streams were cut. A link that cuts
# every connection once data flows is dialed ever less often; a stream that
# cannot come up is named, though the others are up.
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

# A link that resets every connection once it carried 256 KiB: the frames
# re-sent on each new stream make it reset again, for as long as the step
# lasts. After a few such flaps a stream's coming up no longer starts its
# back-off again: the dials slow to reconnect_max apart, where they came
# every reconnect_min (100 ms here, as by default), with a stream_up and a
# stream_down logged at both sites each time.
K=2
STEP_TIMEOUT=8s
RECONNECT_MIN=100ms
RECONNECT_MAX=5s
LINK_ARGS=(--report-every 1MiB)
LINK_EXTRA[0-1]="--cut-after-bytes 262144"
mesh_start
mesh_up 15
ranks_start flap 1000003 1 1
ranks_wait
for ((i = 0; i < K; i++)); do
	[ "${rank_rc[flap-s$i-r0]}" = 1 ] || fail "flap-s$i-r0 exited ${rank_rc[flap-s$i-r0]}, expected 1 (its step timed out)"
done
cuts=$(grep -c "cut after bytes" "$work/link-0-1.log")
log "the link cut $cuts connections in the step's 8 s ($STREAMS streams)"
# Each stream: three flaps 100 ms apart, then 200 ms, 400 ms and on, 9
# dials in 8 s; every 100 ms and a handshake, it would be 60 and more.
[ "$cuts" -ge 4 ] || fail "the link cut only $cuts connections: the step's frames did not flow"
[ "$cuts" -le 30 ] || fail "$cuts connections in 8 s: the streams were dialed again at once after each flap"
# Once no frame is left to re-send, the streams come up and stay up.
wait_streams 0 1 "$STREAMS" 20 "with all its streams up once the step failed"
run_ok after-flap 1000 1 2
mesh_stop

# A link that forwards one connection at a time: one of the two streams
# never comes up. The mesh is degraded, and says which peer lacks streams,
# though a stream reaches it.
HEARTBEAT_TIMEOUT=2s
LINK_ARGS=(--max-conns 1)
LINK_EXTRA=()
mesh_start
wait_for_since "$(site_log 0)" 'event=mesh_degraded site=site-a unreachable=0 reason="site site-b: 1 of 2 streams up"' 15 ||
	fail "site-a did not say that only 1 of its 2 streams to site-b is up: $(since_start "$(site_log 0)" | grep -m2 -o 'event=mesh_degraded.*')"
log "site-a: $(since_start "$(site_log 0)" | grep -m1 -o 'event=mesh_degraded.*of 2 streams up.*')"
mesh_stop
