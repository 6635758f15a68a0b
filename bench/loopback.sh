#!/usr/bin/env bash
# The whole data path through two gateway daemons on loopback, against one
# TLS stream and plain TCP in the same run:
#
#   bench/loopback.sh [--build DIR] [--runs N] [--threads W[,W...]] [--streams S]
#                     [--count C] [--steps T] [--copy] [--refill]
#
# Each run starts two gateways (site-a, site-b; direct exchange, fp32, zstd
# off) and one rank per site (gradgate-bench allreduce on shared buffers,
# --copy for plain ones), times T all-reduce steps of C float32 elements,
# each all-reducing the result of the step before, so that the ranks do no
# work of their own between steps and the cores go to the path alone, as
# they go to the TLS stream alone (--refill: each rank copies fresh input
# into its buffer before every step, a pass over the tensor on the same cores),
# and runs `gradgate-bench transport --plain` (one stream, AES-256-GCM)
# right before and right after, taking the mean of the two. It prints per
# run: the payload each site moves per second (C x 4 bytes over the median
# step time), both sites together, the TLS stream and plain TCP, and their
# ratios; then min/median/max over the runs. With several lane counts
# (--threads 1,2,4,8 --streams 8) each run times the gateways with each in turn
# between the same two baselines, and the summary has a line per count:
# how the path scales with the lanes. Defaults: --build build,
# --runs 3, --threads 0 (the CPUs shared out between the two gateways:
# nproc/2 lanes each, at least 1 and at most --streams, as two gateways on
# one host should be configured), --streams 4, --count 16777216
# (64 MiB), --steps 10.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
build=$here/../build
runs=3 threads=0 streams=4 count=16777216 steps=10 shared=--shared refill=--no-refill

die() { echo "loopback.sh: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
	case "$1" in
	--build | --runs | --threads | --streams | --count | --steps) [ $# -ge 2 ] || die "$1 needs a value" ;;
	esac
	case "$1" in
	--build) build=$2; shift ;;
	--runs) runs=$2; shift ;;
	--threads) threads=$2; shift ;;
	--streams) streams=$2; shift ;;
	--count) count=$2; shift ;;
	--steps) steps=$2; shift ;;
	--copy) shared= ;;
	--refill) refill= ;;
	-h | --help) sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) die "unknown option '$1' (see --help)" ;;
	esac
	shift
done
for v in runs streams count steps; do
	[[ ${!v} =~ ^[0-9]{1,9}$ ]] || die "--$v takes a number (at most 9 digits), not '${!v}'"
done
[[ $threads =~ ^[0-9]{1,9}(,[0-9]{1,9})*$ ]] || die "--threads takes a number or a list like 1,2,4, not '$threads'"
IFS=, read -r -a lane_counts <<<"$threads"
[ "$runs" -ge 1 ] && [ "$steps" -ge 1 ] && [ "$count" -ge 1 ] || die "--runs, --steps and --count must be at least 1"
streams=$((10#$streams))
[ "$streams" -ge 1 ] && [ "$streams" -le 64 ] || die "--streams $streams: a gateway takes 1 to 64 streams per peer"
gradgate=$build/gateway/gradgate bench=$build/bench/gradgate-bench
[ -x "$gradgate" ] && [ -x "$bench" ] || die "no gradgate and gradgate-bench in $build (build first, or pass --build)"
declare -A seen_lanes
for i in "${!lane_counts[@]}"; do
	w=$((10#${lane_counts[$i]}))
	if [ "$w" -eq 0 ]; then
		# Half the CPUs each, but no more lanes than streams.
		w=$(($(nproc) / 2))
		[ "$w" -ge 1 ] || w=1
		[ "$w" -le "$streams" ] || w=$streams
	fi
	[ "$w" -le "$streams" ] || die "--threads $w: more lanes than --streams $streams would leave lanes idle"
	[ -z "${seen_lanes[$w]:-}" ] || die "--threads $threads: the lane count $w comes twice"
	seen_lanes[$w]=1
	lane_counts[$i]=$w
done

work=$(mktemp -d "${TMPDIR:-/tmp}/gg-loopback.XXXXXX")
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

"$here/../examples/make-certs.sh" --out "$work/certs" site-a site-b >/dev/null

# Two free loopback ports: bound once by the kernel, then released.
read -r port_a port_b < <(python3 -c 'import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("127.0.0.1", 0))
print(*[x.getsockname()[1] for x in s])')

config() { # config SITE PORT PEER PEER_PORT LANES
	cat >"$work/$1.toml" <<-EOF
		[site]
		name = "$1"
		listen = "127.0.0.1:$2"
		control = "unix:$work/$1.sock"
		threads = $5
		[tls]
		ca = "$work/certs/ca.pem"
		cert = "$work/certs/$1.pem"
		key = "$work/certs/$1.key"
		[[peers]]
		site = "$3"
		address = "127.0.0.1:$4"
		identity = "dns:$3.gradgate.test"
		[transport]
		streams_per_peer = $streams
		step_timeout = "60s"
		[compression]
		codec = "fp32"
		zstd_level = 0
		[allreduce]
		algorithm = "direct"
		[limits]
		memory = "4GiB"
	EOF
}

# json_field FILE KEY: a number from a one-line JSON object.
json_field() { sed -n "s/.*\"$2\":\([0-9.]*\).*/\1/p" "$1" | head -n 1; }

# daemons RUN LANES: the median step time in ms (the slower site's), into
# step_ms. Runs in this shell, not a subshell: a failure stops the script,
# whose exit ends the gateways and ranks.
daemons() {
	local s i p50 worst=0
	config site-a "$port_a" site-b "$port_b" "$2"
	config site-b "$port_b" site-a "$port_a" "$2"
	chmod 600 "$work"/site-?.toml # whatever the umask: a gateway refuses a config others may write
	for s in site-a site-b; do
		"$gradgate" --config "$work/$s.toml" 2>"$work/$s.log" &
		pids+=("$!")
	done
	for ((i = 0; i < 200; i++)); do
		grep -q event=mesh_up "$work/site-a.log" && grep -q event=mesh_up "$work/site-b.log" && break
		sleep 0.05
	done
	grep -q event=mesh_up "$work/site-a.log" || { cat "$work/site-a.log" >&2; die "the gateways did not connect"; }
	local ranks=()
	for i in 0 1; do
		s=site-a
		[ "$i" = 0 ] || s=site-b
		# shellcheck disable=SC2086
		"$bench" allreduce --endpoint "unix:$work/$s.sock" --job "loop$1" --rank 0 --ranks 1 --site "$i" \
			--sites 2 --count "$count" --steps "$steps" --warmup 2 --data gaussian --check first \
			--json $shared $refill >"$work/rank$i.json" 2>"$work/rank$i.err" &
		ranks+=("$!")
		pids+=("$!")
	done
	# Whichever rank fails first stops the run, named.
	local left=2 ended=()
	while [ "$left" -gt 0 ]; do
		for i in 0 1; do
			[ -z "${ended[$i]:-}" ] && ! kill -0 "${ranks[$i]}" 2>/dev/null || continue
			wait "${ranks[$i]}" || { cat "$work/rank$i.err" >&2; die "rank $i failed"; }
			ended[$i]=1
			left=$((left - 1))
			p50=$(json_field "$work/rank$i.json" step_ms_p50)
			worst=$(awk -v a="$worst" -v b="$p50" 'BEGIN { print (b > a ? b : a) }')
		done
		[ "$left" = 0 ] || sleep 0.05
	done
	# The ranks are reaped: only the gateways are left to stop.
	kill -TERM "${pids[@]:0:2}" 2>/dev/null || true
	wait "${pids[@]:0:2}" || true
	pids=()
	step_ms=$worst
}

# transport WHEN: one TLS stream and plain TCP, into tls_of[WHEN] and plain_of[WHEN].
declare -A tls_of plain_of
transport() {
	"$bench" transport --plain --modes TLS_AES_256_GCM_SHA384 --rtt-count 0 --time 3 --json \
		>"$work/transport.json" 2>/dev/null
	plain_of[$1]=$(grep '"mode":"plain"' "$work/transport.json" | sed -n 's/.*"gbps":\([0-9.]*\).*/\1/p')
	tls_of[$1]=$(grep '"mode":"TLS_AES_256_GCM_SHA384"' "$work/transport.json" | sed -n 's/.*"gbps":\([0-9.]*\).*/\1/p')
}

printf '%-4s %5s %12s %14s %12s %12s %10s %12s %12s\n' run lanes "site Gbit/s" "2 sites Gbit/s" "TLS Gbit/s" \
	"plain Gbit/s" "TLS/plain" "site/TLS" "2 sites/TLS"
declare -A rows
for ((r = 1; r <= runs; r++)); do
	# The baselines just before and just after the daemons, averaged: a
	# shared host's capacity drifts over a run's half minute.
	transport before
	declare -A ms_of=()
	for w in "${lane_counts[@]}"; do
		daemons "$r" "$w"
		ms_of[$w]=$step_ms
	done
	transport after
	tls=$(awk -v a="${tls_of[before]}" -v b="${tls_of[after]}" 'BEGIN { printf "%.3f", (a + b) / 2 }')
	plain=$(awk -v a="${plain_of[before]}" -v b="${plain_of[after]}" 'BEGIN { printf "%.3f", (a + b) / 2 }')
	for w in "${lane_counts[@]}"; do
		row=$(awk -v ms="${ms_of[$w]}" -v c="$count" -v tls="$tls" -v plain="$plain" 'BEGIN {
			site = c * 32 / (ms / 1e3) / 1e9
			printf "%.3f %.3f %.3f %.3f %.3f %.3f %.3f", site, 2 * site, tls, plain, tls / plain, site / tls, 2 * site / tls }')
		rows[$w]+="$row"$'\n'
		# shellcheck disable=SC2086
		printf '%-4s %5s %12s %14s %12s %12s %10s %12s %12s\n' "$r" "$w" $row
	done
done
echo "min/median/max over $runs runs:"
for w in "${lane_counts[@]}"; do
	for col in 1 2 3 4 5 6 7; do
		printf '%s' "${rows[$w]}" | awk -v c=$col '{ print $c }' | sort -g | awk '{ v[NR] = $1 }
			END { m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
				printf "%s/%s/%s ", v[1], m, v[NR] }'
	done | awk -v w="$w" '{ printf "  %s lane(s): site Gbit/s %s, 2 sites %s, TLS stream %s, plain %s\n    TLS/plain %s, site/TLS %s, 2 sites/TLS %s\n",
		w, $1, $2, $3, $4, $5, $6, $7 }'
done
