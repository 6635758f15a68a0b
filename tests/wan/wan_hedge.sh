#!/usr/bin/env bash
# Streams that share one bottleneck do not hedge: 3 sites exchange 4 MiB
# steps directly over gradgate-bench wan's 100 Mbit/s links, 4 streams per
# peer, so every site's 8 streams share its uplink and TCP shares it
# unevenly. When a stream goes idle, a slower one takes its share within a
# few round trips; a copy of its frame would only add bytes to the link.
# Sent on the slow stream's rate over the last quarter second alone, 3.6
# to 5.1 frames a step were copied (cubic); with the watch of the slow
# stream while the other idles (docs/design.md, "Hedging"), 0.4 to 1.0. The run
# fails above 2 a step. Uses cubic, where a stream that lost a packet
# recovers fast: with the shallow queue, bbr's streams wait out
# retransmission timeouts, which hedging is there for. Skips (77) without
# root, network namespaces or cubic (available, and allowed in them).
#
#   wan_hedge.sh BENCH
set -euo pipefail

bench=${1:?usage: wan_hedge.sh BENCH}
prefix=ggh$$
. "$(dirname "$0")/wan_lib.sh"
grep -qw cubic /proc/sys/net/ipv4/tcp_available_congestion_control || skip "the kernel has no cubic"
grep -qw cubic /proc/sys/net/ipv4/tcp_allowed_congestion_control ||
	skip "network namespaces may not take cubic (net.ipv4.tcp_allowed_congestion_control)"

wan_run --sites 3 --ranks 1 --rate 100mbit --sizes 4MiB --codecs fp32 --algorithms direct --streams 4 \
	--steps 5 --warmup 2 --repeat 1 --no-gloo --congestion cubic
python3 - "$tmp/out" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
assert len(rows) == 1 and rows[0]["mode"] == "gradgate fp32 direct", rows
r = rows[0]
assert r["congestion"] == "cubic", r
print(f"hedged {r['hedged_frames_per_step']:.2f} frames a step; {r['step_ms_p50']:.1f} ms a step, "
      f"{r['ratio_model']:.2f} x the model; {r['link_bytes_per_step'] / r['wire_bytes_per_step']:.3f} x the frames' "
      "bytes on the busiest link")
if r["hedged_frames_per_step"] > 2:
    sys.exit(f"FAIL: {r['hedged_frames_per_step']:.2f} frames a step hedged between streams of one bottleneck")
PY
