#!/usr/bin/env bash
# Steps through real gateways: K sites (2, 3 or 4), 1-3 ranks per site,
# 1 and 1000003 elements, every codec (int8/int4 with both block scales)
# and both algorithms, in a covering set rather than the full product.
# Every rank checks its result against the exact global sum (exactly for
# fp32, within the codec's bound otherwise) and exits 0; all ranks of all
# sites print the same digest; every gateway stops cleanly. One case per K
# also keeps 4 steps in flight per rank (gg_allreduce_start), as a
# pipelined trainer does. Site 1 runs on one thread, the others on two.
#
#   allreduce.sh K
. "$(dirname "$0")/lib.sh"

K=${1:?usage: allreduce.sh K}
SITE_THREADS[1]=1 # one gateway of each mesh runs everything on one loop, the others on two lanes

# codec scale algorithm ranks-per-site steps [pipelined]
case $K in
2) cases=("fp32 fp32 direct 1 3 pipelined" "bf16 fp32 ring 3 2" "int8 fp16 ring 2 3") ;;
3) cases=("bf16-split fp32 direct 2 2" "int8 fp32 ring 1 3" "int4 fp16 direct 3 2" "fp32 fp32 ring 2 2 pipelined") ;;
4) cases=("int8 fp16 direct 2 2 pipelined" "int4 fp32 ring 1 3" "fp32 fp32 ring 1 2" "bf16 fp32 direct 1 2"
	"bf16-split fp32 ring 1 2") ;;
*) fail "K must be 2, 3 or 4" ;;
esac

for c in "${cases[@]}"; do
	pipelined=
	read -r CODEC SCALE ALGO ranks steps pipelined <<<"$c"
	mesh_start
	mesh_up 15
	run_ok "one-$CODEC" 1 "$ranks" "$steps"
	run_ok "big-$CODEC" 1000003 "$ranks" "$steps"
	[ -z "$pipelined" ] || run_ok "pipe-$CODEC" 100003 "$ranks" 12 -- --inflight 4
	for ((i = 0; i < K; i++)); do
		expect_none "$(site_log "$i")" 'event=(step_failed|peer_mismatch|step_refused)' "${SITES[$i]}"
	done
	mesh_stop
done
