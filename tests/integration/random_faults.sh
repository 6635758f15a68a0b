#!/usr/bin/env bash
# Random faults against a 3-site mesh, job after job, until STEPS steps
# have run; not part of the default test run (it takes minutes):
#
#   meson test -C build --setup slow --suite soak            (1000 steps)
#   GG_FAULT_STEPS=200 GG_FAULT_SEED=7 bash tests/integration/random_faults.sh   (with the
#   GRADGATE, BENCH, LINKEM and MAKE_CERTS variables meson sets)
#
# Each job runs 2 ranks per site for 20 steps, fp32 with inputs whose sums
# are exact, each rank checking every result bit for bit and reporting
# every step's outcome; one fault, drawn at random, hits it: none, ranks
# that disagree, sites that disagree, a late site against a short
# deadline, a rank killed, a gateway frozen past heartbeat_timeout, a
# gateway killed and restarted, or every stream cut (repaired). Counted:
# steps, faults, wrong results (must be 0), steps whose ranks split
# between success and failure (must be 0), ranks that hung (must be 0),
# and the gateways' RSS and open descriptors before and after.
. "$(dirname "$0")/lib.sh"

K=3
ALGO=${GG_FAULT_ALGO:-ring}
STEP_TIMEOUT=20s
HEARTBEAT_TIMEOUT=2s
RANK_LIMIT=60
LINK_ARGS=(--buffer 1MiB) # linkem between the sites, to cut streams
total=${GG_FAULT_STEPS:-1000}
RANDOM=${GG_FAULT_SEED:-1}
JOB_STEPS=20
COUNT=50000

steps=0 faults=0 wrong=0 splits=0 hangs=0 jobs=0
declare -A fault_count

gw_stat() { # gw_stat I: "RSS_KB FDS" of site I's gateway
	local pid=${gw_pid[$1]}
	echo "$(awk '/^VmRSS/ {print $2}' "/proc/$pid/status") $(ls "/proc/$pid/fd" | wc -l)"
}

# run_job N FAULT: job N with one fault; adds to the counters.
run_job() {
	local job="rf$1" fault=$2 s r t ext fstep=$((2 + RANDOM % 15)) victim_site=$((RANDOM % K))
	local -A extra=()
	case $fault in
	ranks-disagree) extra["$victim_site:1"]="--mismatch-step $fstep" ;;
	sites-disagree) for r in 0 1; do extra["$victim_site:$r"]="--mismatch-step $fstep"; done ;;
	deadline)
		for ((s = 0; s < K; s++)); do
			for r in 0 1; do extra["$s:$r"]="--timeout-ms 1000@$fstep"; done
		done
		for r in 0 1; do extra["$victim_site:$r"]="--timeout-ms 1000@$fstep --late 2500@$fstep"; done
		;;
	esac
	for ((s = 0; s < K; s++)); do
		for r in 0 1; do
			# shellcheck disable=SC2086
			rank_start "$job" "$COUNT" "$r" 2 "$s" "$JOB_STEPS" --per-step ${extra["$s:$r"]:-}
		done
	done
	local dead_site=-1 dead_rank=""
	case $fault in
	rank-killed | gateway-frozen | gateway-killed | streams-cut)
		# Lands during step fstep at the victim site, or so.
		wait_for "$work/$job-s$victim_site-r0.out" "^step $fstep rc=" 30 || true
		;;
	esac
	case $fault in
	rank-killed)
		dead_rank="$victim_site:1"
		kill -KILL "${rank_pids[$((victim_site * 2 + 1))]}" 2>/dev/null || true
		;;
	gateway-frozen)
		kill -STOP "${gw_pid[$victim_site]}"
		sleep 3
		kill -CONT "${gw_pid[$victim_site]}"
		;;
	gateway-killed)
		dead_site=$victim_site
		gw_stop "$victim_site" KILL
		gw_start "$victim_site"
		;;
	streams-cut)
		for k in "${!link_pid[@]}"; do kill -USR1 "${link_pid[$k]}"; done
		;;
	esac
	local names=("${rank_names[@]}") deadline=$((${EPOCHREALTIME/[.,]/} + RANK_LIMIT * 1000000))
	for i in "${!rank_pids[@]}"; do
		while alive "${rank_pids[$i]}"; do
			if [ "${EPOCHREALTIME/[.,]/}" -ge "$deadline" ]; then
				hangs=$((hangs + 1))
				log "HANG: ${rank_names[$i]} still runs after ${RANK_LIMIT} s"
				kill -KILL "${rank_pids[$i]}" 2>/dev/null || true
			fi
			sleep 0.05
		done
		reap "${rank_pids[$i]}"
	done
	rank_pids=()
	rank_names=()
	[ "$dead_site" -lt 0 ] || mesh_up 15

	# Outcomes per step: every rank that lived (and whose gateway did)
	# succeeded with the same bytes, or failed.
	for ((t = 1; t <= JOB_STEPS; t++)); do
		local first="" split=0 line
		for ((s = 0; s < K; s++)); do
			[ "$s" != "$dead_site" ] || continue
			for r in 0 1; do
				[ "$s:$r" != "$dead_rank" ] || continue
				line=$(grep -E "^step $t rc=" "$work/$job-s$s-r$r.out" || true)
				[ -n "$line" ] || line="none"
				case $line in *rc=0*) line="ok ${line##*digest=}" ;; none) ;; *) line=failed ;; esac
				[ -n "$first" ] || first=$line
				[ "$line" = "$first" ] || split=1
			done
		done
		[ "$first" = none ] && continue
		steps=$((steps + 1))
		if [ $split = 1 ]; then
			splits=$((splits + 1))
			log "SPLIT: step $t of $job ($fault):"
			for ((s = 0; s < K; s++)); do
				for r in 0 1; do
					log "  s$s r$r: $(grep -E "^step $t rc=" "$work/$job-s$s-r$r.out") $(grep -E "step $t: error" "$work/$job-s$s-r$r.err" | cut -c1-250)"
				done
			done
		fi
	done
	for name in "${names[@]}"; do
		local w
		w=$(sed -n 's/.* wrong=\([0-9]*\) .*/\1/p' "$work/$name.out")
		wrong=$((wrong + ${w:-0}))
	done
	[ "$splits$hangs" != 00 ] || rm -f "$work/$job"-*.out "$work/$job"-*.err
}

mesh_start
mesh_up 15
run_ok warm 1000 1 2
declare -a before
for ((s = 0; s < K; s++)); do before[$s]=$(gw_stat "$s"); done
kinds=(none ranks-disagree sites-disagree deadline rank-killed gateway-frozen gateway-killed streams-cut)
while [ "$steps" -lt "$total" ]; do
	jobs=$((jobs + 1))
	fault=${kinds[$((RANDOM % ${#kinds[@]}))]}
	[ "$fault" = none ] || faults=$((faults + 1))
	fault_count[$fault]=$((${fault_count[$fault]:-0} + 1))
	run_job "$jobs" "$fault"
	rss=()
	for ((s = 0; s < K; s++)); do rss+=("$(gw_stat "$s" | cut -d' ' -f1)"); done
	log "job $jobs ($fault): $steps steps, $wrong wrong, $splits split, $hangs hung; RSS KiB ${rss[*]}"
done
for ((s = 0; s < K; s++)); do
	log "${SITES[$s]}: RSS KiB and fds before $(cut -d' ' -f1,2 <<<"${before[$s]}"), after $(gw_stat "$s")"
done
for f in "${kinds[@]}"; do log "  $f: ${fault_count[$f]:-0} jobs"; done
log "random faults: $steps steps in $jobs jobs, $faults faults, $wrong wrong results, $splits split outcomes, $hangs hangs"
[ "$wrong" = 0 ] && [ "$splits" = 0 ] && [ "$hangs" = 0 ] || fail "wrong results, split outcomes or hangs"
mesh_stop
