#!/usr/bin/env bash
# The live demo: three gateways on loopback (examples/site-{a,b,c}.toml),
# two training ranks per site, a few hundred all-reduce steps through the
# client library, every result checked against the exact global sum, and
# every rank's results compared across sites. Prints a short report and
# exits 0 only if every check passed.
#
#   examples/demo.sh [BUILD_DIR] [--steps N] [--count ELEMENTS]
set -uo pipefail
usage() { sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; }
bad() { echo "demo: $*" >&2; usage >&2; exit 2; }
build= steps=200 count=1048576
while [ $# -gt 0 ]; do
	case "$1" in
	--steps|--count)
		[ $# -ge 2 ] || bad "$1 needs a value"
		[[ $2 =~ ^[1-9][0-9]{0,8}$ ]] || bad "$1 wants a whole number from 1 to 999999999, not '$2'"
		if [ "$1" = --steps ]; then steps=$2; else count=$2; fi
		shift ;;
	-h|--help) usage; exit 0 ;;
	-*) bad "unknown option '$1'" ;;
	*) build=$1 ;;
	esac
	shift
done
# BUILD_DIR as the caller named it, before the move to the source tree;
# without one, the source tree's build/.
case "$build" in
"") build=$(cd "$(dirname "$0")/.." && pwd)/build ;;
/*) ;;
*) build=$PWD/$build ;;
esac
cd "$(dirname "$0")/.."
gradgate=$build/gateway/gradgate bench=$build/bench/gradgate-bench
[ -x "$gradgate" ] && [ -x "$bench" ] || { echo "demo: build first (missing $gradgate)" >&2; exit 1; }
[ -f examples/certs/ca.pem ] || examples/make-certs.sh >/dev/null

sites=(site-a site-b site-c)
ranks=2
codec=$(sed -n 's/^codec = "\(.*\)"/\1/p' examples/site-a.toml)
logs=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
	wait 2>/dev/null
	rm -rf "$logs"
}
trap cleanup EXIT

for port in 7101 7102 7103 9464 9465 9466; do
	if (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null; then
		echo "demo: port $port is in use; stop what listens there (the example configs use 7101-7103 and 9464-9466)" >&2
		exit 1
	fi
done

echo "starting gateways: ${sites[*]} (codec $codec, $ranks ranks per site)"
for s in "${sites[@]}"; do
	"$gradgate" --config "examples/$s.toml" 2>"$logs/$s.log" &
	pids+=($!)
done
for i in $(seq 100); do
	up=$(grep -l 'event=mesh_up' "$logs"/*.log 2>/dev/null | wc -l)
	[ "$up" = 3 ] && break
	sleep 0.1
done
if [ "$up" != 3 ]; then
	echo "demo: the gateways did not connect within 10 s:" >&2
	tail -n 5 "$logs"/*.log >&2
	exit 1
fi

size="$((count * 4 / 1048576)) MiB"
[ "$count" -ge 262144 ] || size="$((count * 4 / 1024)) KiB"
[ "$count" -ge 256 ] || size="$((count * 4)) bytes"
echo "running $steps all-reduce steps of $count float32 elements ($size)"
start=$(date +%s.%N)
rank_pids=()
for i in "${!sites[@]}"; do
	for r in $(seq 0 $((ranks - 1))); do
		"$bench" allreduce --endpoint "unix:/tmp/gradgate-${sites[$i]}.sock" --job demo \
			--rank "$r" --ranks "$ranks" --site "$i" --sites "${#sites[@]}" \
			--count "$count" --steps "$steps" --codec "$codec" \
			>"$logs/rank-$i-$r.out" 2>"$logs/rank-$i-$r.err" &
		rank_pids+=($!)
	done
done
failed=0
for p in "${rank_pids[@]}"; do
	wait "$p" || failed=$((failed + 1))
done
elapsed=$(echo "$(date +%s.%N) - $start" | bc)

# Each gateway's Prometheus page ([metrics] in the example configs), now
# that the steps are done; the report checks it against the gateways' own
# totals.
for i in "${!sites[@]}"; do
	python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())' \
		"http://127.0.0.1:$((9464 + i))/metrics" >"$logs/${sites[$i]}.metrics" 2>&1 || true
done

for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
pids=()

digests=$(sed -n 's/.*digest=\([0-9a-f]*\).*/\1/p' "$logs"/rank-*.out | sort -u)
ndigest=$(echo "$digests" | grep -c .)
python3 - "$logs" "$steps" "$count" "$elapsed" "$failed" "$ndigest" <<'PY'
import glob, re, sys
logs, steps, count, elapsed, failed, ndigest = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
kv = lambda line: dict(re.findall(r'(\w+)=("[^"]*"|\S+)', line))
ranks = [kv(open(f).read()) for f in sorted(glob.glob(logs + "/rank-*.out"))]
gws = []
for f in sorted(glob.glob(logs + "/site-*.log")):
    stop = [l for l in open(f) if "event=stopped" in l]
    gws.append(kv(stop[-1]) if stop else {})
p50 = sorted(float(r.get("step_ms_p50", "nan")) for r in ranks)
p99 = max(float(r.get("step_ms_p99", "nan")) for r in ranks)
raw = sum(int(g.get("raw_bytes_out", 0)) for g in gws)
wire = sum(int(g.get("wire_bytes_out", 0)) for g in gws)
tls = sum(float(g.get("tls_s", 0)) for g in gws)
codec = sum(float(g.get("encode_s", 0)) + float(g.get("decode_s", 0)) for g in gws)
up = sum(float(g.get("uptime_s", 0)) for g in gws)
done = [int(g.get("steps_done", 0)) for g in gws]
families = ["raw_bytes_total", "encoded_bytes_total", "wire_bytes_total", "compression_ratio", "peer_rtt_seconds",
            "peer_delivery_rate_bytes_per_second", "peer_streams_up", "peer_stream_ups_total",
            "peer_stream_downs_total", "stream_failures_total", "steps_completed_total", "step_failures_total",
            "step_duration_seconds", "step_phase_seconds_total", "tls_seconds_total", "memory_bytes",
            "memory_limit_bytes", "jobs", "sessions", "build_info"]
metrics_ok, metrics_why = True, []
for f, g in zip(sorted(glob.glob(logs + "/site-*.metrics")), gws):
    page = open(f).read()
    types = set(re.findall(r"^# TYPE gradgate_(\w+) ", page, re.M))
    missing = [x for x in families if x not in types]
    val = lambda name, labels="": sum(float(v) for v in re.findall(r"^gradgate_" + name + r"(?:\{[^}]*" + labels + r"[^}]*\})? (\S+)$", page, re.M))
    site = f.split("/")[-1].split(".")[0]
    if missing:
        metrics_ok = False
        metrics_why.append(f"{site} lacks {', '.join(missing)}")
    if val("steps_completed_total") != steps:
        metrics_ok = False
        metrics_why.append(f"{site} counted {val('steps_completed_total'):.0f} steps, not {steps}")
    if val("raw_bytes_total", 'direction="sent"') != int(g.get("raw_bytes_out", -1)):
        metrics_ok = False
        metrics_why.append(f"{site}'s raw bytes sent differ from its stopped line")
if len(glob.glob(logs + "/site-*.metrics")) != 3:
    metrics_ok, metrics_why = False, metrics_why + ["not every gateway's page was scraped"]
print()
print("demo report")
print(f"  steps                 {steps} per rank, 6 ranks at 3 sites; gateways completed {done}")
print(f"  time per step         p50 {p50[len(p50)//2]:.1f} ms, worst rank p99 {p99:.1f} ms ({elapsed:.1f} s in all)")
print(f"  encoded vs raw        {wire/2**20:.1f} MiB sent for {raw/2**20:.1f} MiB of fp32 ({raw/wire if wire else 0:.2f}x smaller)")
print(f"  time in encryption    {tls:.2f} s of {up:.1f} gateway-seconds ({100*tls/up if up else 0:.1f}%); codec {codec:.2f} s")
print(f"  results               {'every rank matched the exact sum within bound' if failed == 0 else f'{failed} rank(s) FAILED'}; "
      f"{'all ranks of all sites got identical bytes' if ndigest == 1 else f'{ndigest} different results: MISMATCH'}")
print(f"  metrics               " + (f"every gateway's page has all {len(families)} families checked; steps and bytes agree with its totals"
                                     if metrics_ok else "FAILED: " + "; ".join(metrics_why)))
sys.exit(0 if failed == 0 and ndigest == 1 and all(d == steps for d in done) and metrics_ok else 1)
PY
status=$?
if [ $status != 0 ]; then
	echo "demo: FAILED; rank errors and gateway logs follow" >&2
	cat "$logs"/rank-*.err >&2
	tail -n 20 "$logs"/site-*.log >&2
fi
exit $status
