#!/usr/bin/env bash
# One slow stream among fast ones: a stream takes a new frame only while it
# holds none unwritten, and its socket only so much unsent
# (TCP_NOTSENT_LOWAT), so frames go to the streams that keep up. The slow
# stream must carry well under its even share of the bytes, and the steps
# stay exact. Streams pinned to chunks would give it exactly its share, and
# every step would wait for it: the steps would take at least that share's
# time at its rate. Taken when it is free, it carries what its rate allows
# while the others move the rest, so the slower the machine runs the steps
# (a sanitizer's build on a busy host), the more it carries: under half its
# share, or under three quarters in steps that took less than half the time
# pinned chunks would need. And the frames the slow stream still holds at
# a step's end go once more on a fast one (hedged): at least one in the
# four steps, counted in the gateways' 'stopped' lines.
. "$(dirname "$0")/lib.sh"

K=2
STREAMS=4
THREADS=1
ALGO=direct
STEP_TIMEOUT=60s
# Every 4th connection through linkem runs at 8 Mbit/s, the others
# unlimited: of the 4 streams, dialed together, one is slow. Small relay
# buffers, so that it pushes back soon.
LINK_ARGS=(--buffer 64KiB --socket-buffer 128KiB --slow-every 4 --slow-rate 8mbit --report-every 64KiB)
mesh_start
mesh_up 15
t0=${EPOCHREALTIME/[.,]/}
run_ok slow 4194304 1 4
ms=$(((${EPOCHREALTIME/[.,]/} - t0) / 1000))

# Bytes each connection forwarded, both directions, from linkem's reports
# (every 64 KiB; the last of each direction counts). The slow one is the
# one of the last 4 accepted whose number is a multiple of 4.
read -r slow total conns < <(awk '
	/connection [0-9]+ accepted/ { if ($3 + 0 > top) top = $3 + 0 }
	/connection [0-9]+ (up|down) [0-9]+ bytes/ {
		id = $3 + 0; v = $5 + 0
		if (v > last[id, $4]) last[id, $4] = v
		seen[id] = 1
	}
	END {
		for (id in seen) { b = last[id, "up"] + last[id, "down"]; total += b; n++ }
		s = top - top % 4
		print last[s, "up"] + last[s, "down"], total, n
	}' "$work/link-0-1.log")
log "4 steps of 16 MiB in $ms ms; connections $conns; the slow one forwarded $slow of $total bytes"
[ "$conns" -ge "$STREAMS" ] || fail "linkem saw $conns connections carry data, not $STREAMS"
share=$((total / STREAMS))
pinned_ms=$((share / 1000)) # its share at 8 Mbit/s, 1000 bytes a millisecond
if [ "$slow" -ge $((share / 2)) ]; then
	[ "$slow" -lt $((share * 3 / 4)) ] && [ "$ms" -lt $((pinned_ms / 2)) ] ||
		fail "the slow stream forwarded $slow bytes of its even share $share, in steps of $ms ms" \
			"(pinned chunks: at least $pinned_ms ms): frames did not avoid it"
	log "a slow run: the slow stream carried over half its share, at its rate, while the steps took" \
		"$ms ms of the $pinned_ms ms pinned chunks would need"
fi
mesh_stop
hedged=0
for i in 0 1; do
	n=$(grep -o 'event=stopped .*' "$(site_log $i)" | tail -1 | grep -o ' hedged_frames=[0-9]*' | cut -d= -f2)
	hedged=$((hedged + ${n:-0}))
done
log "frames hedged off the slow stream: $hedged"
[ "$hedged" -gt 0 ] || fail "no frame was hedged off the slow stream (the 'stopped' lines' hedged_frames)"
