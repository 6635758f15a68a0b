#!/usr/bin/env bash
# A step completes at every site or fails at every site, fast, with the
# code of its real cause, and the next step works:
#
#   faults.sh CASE K:ALGORITHM...   e.g. faults.sh ranks-disagree 2:direct 3:ring
#
# ranks-disagree  one rank of site-a announces one element more at step 2:
#                 GG_ERR_MISMATCH at every rank of every site, at once
# sites-disagree  every rank of the last site does: the same
# rank-killed     a rank of site-a dies while step 2 is with the gateways:
#                 GG_ERR_RANK everywhere, naming it, long before step_timeout
# rank-left       a rank of site-a leaves after step 1 while its other rank
#                 is 4 s late to step 2: the other sites fail steps 2 and 3
#                 at once with GG_ERR_RANK naming it, not when the late
#                 rank comes (nor at their deadline)
# deadline        site-a's ranks give each step 1.5 s and the last site comes
#                 4 s late to step 2: GG_ERR_TIMEOUT everywhere, from site-a's
#                 deadline on; the same sessions go on with step 3
# deadline-waiting
#                 the same deadline, but only one rank of the last site is
#                 late (4 s): its other rank, which announced step 2 and
#                 waits for it at its gateway, fails at once too, not when
#                 the late rank comes
# deadline-everywhere
#                 every rank of every site gives step 2 1.5 s and one rank
#                 of the last site is 4 s late: the sites waiting for
#                 others' data give the last site's word time to come
#                 first, so every rank's GG_ERR_TIMEOUT names the late
#                 rank and its site, not data that site never sent
# peer-killed     the last site's gateway is SIGKILLed while the others wait
#                 in step 2: GG_ERR_SITE naming it within heartbeat_timeout
# peer-stopped    the same with SIGSTOP: its streams stay up but fall silent
# peer-stopped-fast
#                 the same with heartbeat_timeout 200ms (interval 50ms), less
#                 than two of an idle loop's 100 ms turns: it still fails
#                 within heartbeat_timeout, not when step_timeout runs out
# peer-terminated the last site's gateway gets SIGTERM while the others wait
#                 for its ranks in step 2: it ends its ranks' jobs before it
#                 closes its streams, so they fail step 2 at once with
#                 GG_ERR_RANK naming its shutdown, well within
#                 heartbeat_timeout
# peer-gone-after-data
#                 the last site's ranks announce step 2 at once and its
#                 gateway sends its data, then is SIGKILLed; the other
#                 site's ranks come a second late, so it holds the whole
#                 result, but its DONE reaches no site, so none can have
#                 completed: GG_ERR_SITE naming the lost site within
#                 heartbeat_timeout, not after step_timeout (2 sites, direct)
# peer-stopped-after-data
#                 the same, but the last site's gateway stands still
#                 (SIGSTOP) instead of dying, and site-a's ranks give each
#                 step 600 ms, two in flight: site-a fails step 2 at its
#                 deadline and heartbeat_timeout more; resumed 3.5 s after
#                 it stopped, the last site holds the whole result and
#                 site-a's DONE, which waited in its sockets, but must fail
#                 the step too, not complete it; step 3, which waited at
#                 site-a behind step 2 past its deadline, fails everywhere
#                 with GG_ERR_SITE naming the lost site (2 sites, direct)
# peer-paused     the last site's gateway stands still (SIGSTOP) for 1.1 s,
#                 over half its heartbeat_timeout, and less than it with the
#                 up to 0.5 s since its last heartbeat, while
#                 its ranks wait in step 2 and site-a's ranks are 6 s late
#                 to it: once it runs again it fails step 2 at once with
#                 GG_ERR_SITE saying it stood still (the others may have
#                 taken it for lost), at every site, not when site-a's
#                 ranks come; they hear the same, and step 3 works
# peer-restarted  the last site's gateway is SIGKILLed and started again
#                 while the others wait in step 2 of 5: its ranks lost their
#                 sessions, so steps 2 to 5 fail at the others at once with
#                 GG_ERR_SITE naming the restart; then the same in step 1,
#                 before any step completed, while a rank of another site
#                 is late to it; then a job the others begin while the
#                 last site's gateway is down (SIGTERM, SIGKILL), which the
#                 restarted one's ranks join: every step completes
# ranks-gone-first
#                 the last site's ranks open their sessions and die before
#                 step 1, while the other sites' ranks are 3 s late to it:
#                 the END reaches those sites before the job is there; as
#                 their ranks come, steps 1 to 3 fail at once with
#                 GG_ERR_RANK naming the death, not at step_timeout; new
#                 ranks of the last site that start the job again while
#                 those others are still to come are refused with them;
#                 where the others first connect after the END, it is a
#                 new run and works
# ranks-gone-unheard
#                 the links between the sites stand still (linkem stopped)
#                 while the last site's ranks of a job die before step 1,
#                 until the other sites' ranks of it have connected: the
#                 END, sent again once streams are back, is of a run that
#                 ended before those ranks came, and ends nothing; the last
#                 site's new ranks run the job with them
# link-one-way    while steps run one after another, the link between
#                 site-a and site-b starts to lose everything site-b sends,
#                 silently (linkem holds it): site-a misses site-b's DONE
#                 of the step in flight, while site-c, which completed it,
#                 says so; no step splits, and once the two lose each other
#                 the steps fail at every site with GG_ERR_SITE (3 sites)
# job-end         int8 jobs whose error-feedback residuals do not fit next to
#                 each other in [limits] memory run one after another: the
#                 end of a job frees them at every site
#
# Every case but job-end runs 3 steps with 2 ranks per site; each rank
# reports every step's outcome, and a step must succeed with the same
# bytes at every rank or fail at every rank with the same code.
# step_timeout is 30 s and heartbeat_timeout 2 s: a case that waited for
# step_timeout fails its time check.
. "$(dirname "$0")/lib.sh"

fault=$1
shift
[ $# -gt 0 ] || fail "usage: faults.sh CASE K:ALGORITHM..."
STEP_TIMEOUT=30s
HEARTBEAT_TIMEOUT=2s
RANK_LIMIT=40
RANKS=2
STEPS=3
COUNT=100000

now_us() { echo "${EPOCHREALTIME/[.,]/}"; }
ms_since() { echo $(((${EPOCHREALTIME/[.,]/} - $1) / 1000)); }

# start_job JOB [SITE:RANK:ARGS...]: RANKS ranks per site for STEPS steps,
# reporting each step; the named ranks get the extra bench arguments.
start_job() {
	local job=$1 s r spec args
	shift
	for ((s = 0; s < K; s++)); do
		for ((r = 0; r < RANKS; r++)); do
			args=()
			for spec in "$@"; do
				[ "${spec%%:*}" = "$s" ] || continue
				spec=${spec#*:}
				[ "${spec%%:*}" = "$r" ] || continue
				read -r -a args <<<"${spec#*:}"
			done
			rank_start "$job" "$COUNT" "$r" "$RANKS" "$s" "$STEPS" --per-step --check none "${args[@]}"
		done
	done
}

# outcome NAME STEP: "ok DIGEST" or "rc=CODE" for a rank's step.
outcome() {
	local line
	line=$(grep -E "^step $2 rc=" "$work/$1.out" || true)
	[ -n "$line" ] || fail "$1 reported no outcome of step $2: $(cat "$work/$1.err")"
	case $line in
	*rc=0*) echo "ok ${line##*digest=}" ;;
	*) echo "rc=${line##*rc=}" ;;
	esac
}

# check_steps JOB [SITE:RANK...]: for each step, every rank (but the named,
# which died) succeeded with the same bytes or failed with the same code:
# no split outcome. Leaves each step's outcome in outcome_of[STEP].
declare -A outcome_of
check_steps() {
	local job=$1 t s r first out skip
	shift
	for ((t = 1; t <= STEPS; t++)); do
		first=
		for ((s = 0; s < K; s++)); do
			for ((r = 0; r < RANKS; r++)); do
				skip=
				for spec in "$@"; do [ "$spec" != "$s:$r" ] || skip=1; done
				[ -z "$skip" ] || continue
				out=$(outcome "$job-s$s-r$r" "$t")
				if [ -z "$first" ]; then
					first=$out
				elif [ "$out" != "$first" ]; then
					fail "step $t of $job split: $job-s0-r0 '$first', $job-s$s-r$r '$out'"
				fi
			done
		done
		outcome_of[$t]=$first
	done
}

# expect_failed JOB STEP CODE REGEX [SITE:RANK...]: every rank (but those
# named) failed STEP with CODE and a message matching REGEX.
expect_failed() {
	local job=$1 step=$2 code=$3 re=$4 s r name skip heard=
	shift 4
	[ "${outcome_of[$step]}" = "rc=$code" ] || fail "step $step of $job: '${outcome_of[$step]}', expected rc=$code"
	for ((s = 0; s < K; s++)); do
		for ((r = 0; r < RANKS; r++)); do
			skip=
			for spec in "$@"; do [ "$spec" != "$s:$r" ] || skip=1; done
			[ -z "$skip" ] || continue
			name=$job-s$s-r$r
			expect "$work/$name.err" "step $step: error $code \(GG_ERR_[A-Z_]+\): .*$re" "$name's error of step $step"
			heard=$s
		done
	done
	log "  ${SITES[$heard]}'s rank hears: $(grep -m1 "step $step: error" "$work/$job-s$heard-r0.err" | cut -c1-300)"
}

expect_ok() {
	local job=$1 step
	shift
	for step in "$@"; do
		[ "${outcome_of[$step]%% *}" = ok ] || fail "step $step of $job: '${outcome_of[$step]}', expected success"
	done
}

# within MS LIMIT WHAT: MS must be below LIMIT.
within() {
	[ "$1" -lt "$2" ] || fail "$3 took $1 ms (bound $2 ms)"
}

case_ranks_disagree() {
	local t0 s
	t0=$(now_us)
	start_job rd "0:1:--mismatch-step 2"
	ranks_wait
	check_steps rd
	expect_ok rd 1 3
	expect_failed rd 2 -10 "ranks of site site-a disagree: rank 0 announced tensor 1 \\(100000 .*rank 1 announced tensor 1 \\(100001 "
	within "$(ms_since "$t0")" 8000 "3 steps with one failed at every site"
	# Every site logs the failed step, site-a too, whose ranks failed it.
	for ((s = 0; s < K; s++)); do
		expect "$(site_log "$s")" "level=error event=step_failed job=rd step=2 reason=.*disagree" "${SITES[$s]}'s log"
	done
}

case_sites_disagree() {
	local t0 r s specs=()
	for ((r = 0; r < RANKS; r++)); do specs+=("$last:$r:--mismatch-step 2"); done
	t0=$(now_us)
	start_job sd "${specs[@]}"
	ranks_wait
	check_steps sd
	expect_ok sd 1 3
	expect_failed sd 2 -10 "announced tensor 1 with 10000[01] elements .*tensor 1 with 10000[01] elements"
	# The sites that heard of it from another name the step once.
	for ((s = 0; s < K; s++)); do
		expect_none "$work/sd-s$s-r0.err" "step 2 of job .sd.: .*step 2 of job .sd.:" "sd-s$s-r0"
	done
	within "$(ms_since "$t0")" 8000 "3 steps with one failed at every site"
}

case_rank_killed() {
	local r specs=() victim killed
	# The last site comes 3 s late to step 2, so site-a's gateway holds
	# step 2 (both its ranks announced it) when its rank 1 dies.
	for ((r = 0; r < RANKS; r++)); do specs+=("$last:$r:--late 3000@2"); done
	start_job rk "${specs[@]}"
	victim=${rank_pids[1]}
	[ "${rank_names[1]}" = rk-s0-r1 ] || fail "unexpected rank order: ${rank_names[*]}"
	wait_for "$work/rk-s0-r0.out" "^step 1 rc=" 10 || fail "step 1 did not end at site-a"
	sleep 0.5 # site-a's ranks announce step 2 and its gateway holds it
	kill -KILL "$victim"
	killed=$(now_us)
	wait_for "$work/rk-s0-r0.out" "^step 2 rc=" 2 || fail "site-a's other rank did not hear of the death at once"
	within "$(ms_since "$killed")" 1000 "site-a's other rank hearing of the death"
	# The late site hears as its ranks come to step 2, 3 s after step 1.
	ranks_wait
	within "$(ms_since "$killed")" 8000 "every site hearing of the death"
	check_steps rk 0:1
	expect_ok rk 1
	expect_failed rk 2 -11 "rank 1 of job 'rk' (disconnected|lost its connection \\([^)]+\\)) during step 2" 0:1
}

case_rank_left() {
	local t0 took t
	start_job rl "0:0:--steps 1" "0:1:--late 4000@2"
	wait_for "$work/rl-s0-r0.out" "^step 1 rc=0" 10 || fail "step 1 did not work at site-a"
	t0=$(now_us)
	wait_for "$work/rl-s$last-r0.out" "^step 3 rc=" 3 ||
		fail "${SITES[$last]} did not fail steps 2 and 3 before site-a's late rank came"
	took=$(ms_since "$t0")
	log "  ${SITES[$last]}'s rank had steps 2 and 3 failed ${took} ms after site-a's rank 0 left"
	within "$took" 1500 "the other sites failing the steps after a rank left"
	ranks_wait
	check_steps rl 0:0
	expect_ok rl 1
	for t in 2 3; do
		expect_failed rl $t -11 "rank 0 of job 'rl' disconnected after step 1 at site site-a" 0:0
	done
}

case_ranks_gone_first() {
	local s r t specs=() killed took
	# Late enough that the other sites' gateways show the job failed for a
	# while before their ranks announce step 1.
	for ((s = 0; s < last; s++)); do
		for ((r = 0; r < RANKS; r++)); do specs+=("$s:$r:--late 4500@1"); done
	done
	for ((r = 0; r < RANKS; r++)); do specs+=("$last:$r:--late 20000@1"); done
	start_job rg "${specs[@]}"
	wait_job "$last" rg "$RANKS/$RANKS +0 +idle " "had all its ranks"
	[ "${rank_names[$((last * RANKS))]}" = "rg-s$last-r0" ] || fail "unexpected rank order: ${rank_names[*]}"
	kill -KILL "${rank_pids[@]:$((last * RANKS)):RANKS}"
	killed=$(now_us)
	# Its ranks there, still to come to step 1, are shown a failed job.
	wait_job 0 rg "$RANKS/$RANKS +0 +failed " "shown failed once the last site's ranks were gone"
	for ((s = 0; s < last; s++)); do
		reported rg "$s" "$STEPS" 12 "the outcome of its last step"
	done
	took=$(ms_since "$killed")
	log "  the other sites' ranks had every step's outcome ${took} ms after the last site's died"
	within "$took" 8000 "the other sites failing their steps"
	ranks_wait
	local dead=()
	for ((r = 0; r < RANKS; r++)); do dead+=("$last:$r"); done
	check_steps rg "${dead[@]}"
	for ((t = 1; t <= STEPS; t++)); do
		expect_failed rg $t -11 "site ${SITES[$last]} ended job 'rg' before its first step: its ranks there are gone: rank [01] of job 'rg' (disconnected|lost its connection \\([^)]+\\)) before its first step at site ${SITES[$last]}" "${dead[@]}"
	done
	# The last site's ranks start the job again while the others' ranks
	# of the old run are still to come: a new run under a name whose old
	# one still has ranks is refused, at every site.
	start_job rg2 "${specs[@]}"
	wait_job "$last" rg2 "$RANKS/$RANKS +0 +idle " "had all its ranks"
	kill -KILL "${rank_pids[@]:$((last * RANKS)):RANKS}"
	# Every killed rank's disconnect heard first (milliseconds): a rank of
	# the new run that came between two of them would be refused, the
	# failed job not yet gone, and its partner would wait alone.
	job_gone "$last" rg2
	restart_ranks rg2
	ranks_wait
	check_steps rg2
	expect_failed rg2 1 -11 "site ${SITES[$last]} ended job 'rg2' before its first step"
	# Ranks that connect only after the END are of a new run: the last
	# site's ranks go and come again before the others' first connect,
	# and the job works everywhere.
	for ((r = 0; r < RANKS; r++)); do
		rank_start rg3 "$COUNT" "$r" "$RANKS" "$last" "$STEPS" --per-step --check none --late 20000@1
	done
	wait_job "$last" rg3 "$RANKS/$RANKS +0 +idle " "had all its ranks"
	kill -KILL "${rank_pids[@]}"
	job_gone "$last" rg3
	for ((s = 0; s < last; s++)); do
		wait_for "$(site_log "$s")" "event=peer_job_ended site=${SITES[$last]} job=rg3 .*here=none" 10 ||
			fail "${SITES[$s]} did not hear that rg3 ended at ${SITES[$last]}"
	done
	restart_ranks rg3
	for ((s = 0; s < last; s++)); do
		for ((r = 0; r < RANKS; r++)); do
			rank_start rg3 "$COUNT" "$r" "$RANKS" "$s" "$STEPS" --per-step --check none
		done
	done
	ranks_wait
	check_steps rg3
	expect_ok rg3 1 2 3
	run_ok after 1000 1 2
}

case_ranks_gone_unheard() {
	local s r k
	for ((r = 0; r < RANKS; r++)); do
		rank_start ru "$COUNT" "$r" "$RANKS" "$last" "$STEPS" --per-step --check none --late 20000@1
	done
	wait_job "$last" ru "$RANKS/$RANKS +0 +idle " "had all its ranks"
	kill -STOP "${link_pid[@]}"
	kill -KILL "${rank_pids[@]}"
	job_gone "$last" ru
	for ((s = 0; s < last; s++)); do
		# Every stream: one still up would carry the END queued at the
		# job's end, of age 0, when the links move again, and the ranks
		# here could not tell it from an END of their own run.
		for ((k = 0; k < STREAMS; k++)); do
			wait_for "$(site_log "$s")" "event=stream_down site=${SITES[$last]} stream=$k .*heartbeat" 10 ||
				fail "${SITES[$s]} did not lose its stream $k to ${SITES[$last]}"
		done
		for ((r = 0; r < RANKS; r++)); do
			rank_start ru "$COUNT" "$r" "$RANKS" "$s" "$STEPS" --per-step --check none --late 6000@1
		done
		wait_job "$s" ru "$RANKS/$RANKS +0 +idle " "had all its ranks"
	done
	kill -CONT "${link_pid[@]}"
	for ((s = 0; s < last; s++)); do
		wait_for "$(site_log "$s")" "event=peer_job_ended site=${SITES[$last]} job=ru .*here=later_ranks" 10 ||
			fail "${SITES[$s]} did not hear the END of ${SITES[$last]}'s old run of ru, or took it for its ranks' run"
	done
	restart_ranks ru
	ranks_wait
	check_steps ru
	expect_ok ru 1 2 3
}

case_link_one_way() {
	local STEPS=100 RANKS=1 t first_failed=
	start_job ow
	wait_for "$work/ow-s0-r0.out" '^step 40 rc=' 20 || fail "site-a's rank did not get to step 40 within 20 s"
	kill -USR2 "${link_pid[01]}"
	log "holding what site-b sends site-a"
	ranks_wait
	check_steps ow
	for ((t = 1; t <= STEPS; t++)); do
		[ "${outcome_of[$t]%% *}" = ok ] || { first_failed=$t; break; }
	done
	[ -n "$first_failed" ] || fail "every step completed, though site-a and site-b lost each other"
	[ "$first_failed" -gt 40 ] || fail "step $first_failed failed before the link lost anything"
	for ((t = first_failed; t <= STEPS; t++)); do
		[ "${outcome_of[$t]}" = rc=-12 ] || fail "step $t after the first failed one: '${outcome_of[$t]}'"
	done
	log "  steps 1-$((first_failed - 1)) completed at every site, $first_failed-$STEPS failed at every site with GG_ERR_SITE"
	log "  site-a: $(grep -m1 -o 'event=step_failed.*' "$(site_log 0)" | cut -c1-240)"
}

# job_gone S JOB: waits up to 10 s until site S's gateway no longer lists
# JOB (its ranks are gone and it sent its END).
job_gone() {
	local i sock="unix:$work/${SITES[$1]}.sock"
	for ((i = 0; i < 200; i++)); do
		"$GRADGATE" status --control "$sock" 2>/dev/null | grep -Eq "^$2 " || return 0
		sleep 0.05
	done
	fail "job $2 still listed at ${SITES[$1]}: $("$GRADGATE" status --control "$sock" 2>&1)"
}

# restart_ranks JOB: the last site's ranks of JOB start again (as new
# processes, under the same names).
restart_ranks() {
	local r
	for ((r = 0; r < RANKS; r++)); do
		rank_start "$1" "$COUNT" "$r" "$RANKS" "$last" "$STEPS" --per-step --check none
	done
}

case_deadline() {
	local r specs=() t0
	for ((r = 0; r < RANKS; r++)); do
		specs+=("0:$r:--timeout-ms 1500@2")
		specs+=("$last:$r:--late 4000@2")
	done
	t0=$(now_us)
	start_job dl "${specs[@]}"
	wait_for "$work/dl-s0-r0.out" "^step 2 rc=" 10 || fail "site-a's step 2 did not end"
	local at_a
	at_a=$(ms_since "$t0")
	ranks_wait
	check_steps dl
	expect_ok dl 1 3
	# The deadline names the late site, which sent nothing of the step.
	expect_failed dl 2 -8 "missed its 1500ms deadline: site ${SITES[$last]} never sent [a-z-]+ data for shard [0-9]+ chunk [0-9]+ \(no frame of the step came from it: has it started the step\?\)"
	# site-a fails step 2 at its 1.5 s deadline (after step 1), well
	# before step_timeout; the sessions go on to step 3.
	within "$at_a" 6000 "site-a's step 2 at its 1.5 s deadline"
}

# reported JOB SITE STEP SECONDS WHAT: every rank of SITE reports STEP's
# outcome within SECONDS, or the case fails saying WHAT it missed.
reported() {
	local r
	for ((r = 0; r < RANKS; r++)); do
		wait_for "$work/$1-s$2-r$r.out" "^step $3 rc=" "$4" || fail "$1-s$2-r$r did not hear $5"
	done
}

# back_after_kill: the last site's SIGKILLed gateway is gone, its ranks are
# stopped; then it starts again, and a new job works everywhere.
back_after_kill() {
	wait_exit "${gw_pid[$last]}" 5 || fail "the killed gateway still runs"
	reap "${gw_pid[$last]}"
	gw_pid[$last]=
	kill -KILL "${rank_pids[@]}" 2>/dev/null || true
	ranks_wait
	gw_start "$last"
	mesh_up 15
	run_ok after 1000 1 2
}

case_deadline_everywhere() {
	local s r specs=()
	for ((s = 0; s < K; s++)); do
		for ((r = 0; r < RANKS; r++)); do specs+=("$s:$r:--timeout-ms 1500@2"); done
	done
	specs+=("$last:1:--timeout-ms 1500@2 --late 4000@2") # the last spec of a rank is its own
	start_job de "${specs[@]}"
	ranks_wait
	check_steps de
	expect_ok de 1 3
	expect_failed de 2 -8 "timed out after 1500 ms waiting for rank 1 of job 'de' at site ${SITES[$last]}$"
}

case_deadline_waiting() {
	local r specs=("$last:1:--late 4000@2") t0 took
	for ((r = 0; r < RANKS; r++)); do specs+=("0:$r:--timeout-ms 1500@2"); done
	start_job dw "${specs[@]}"
	wait_for "$work/dw-s$last-r0.out" "^step 1 rc=0" 10 || fail "step 1 did not work at ${SITES[$last]}"
	t0=$(now_us)
	wait_for "$work/dw-s$last-r0.out" "^step 2 rc=" 6 || fail "dw-s$last-r0 did not hear of step 2's failure"
	took=$(ms_since "$t0")
	log "  ${SITES[$last]}'s waiting rank failed step 2 ${took} ms after step 1 (site-a's deadline 1.5 s, its other rank 4 s late)"
	within "$took" 3000 "failing step 2 at the rank that waits for a late one"
	ranks_wait
	check_steps dw
	expect_ok dw 1 3
	expect_failed dw 2 -8 "step 2 of job .dw. missed its 1500ms deadline: site ${SITES[$last]} never sent [a-z-]+ data for shard [0-9]+ chunk [0-9]+ \(no frame of the step came from it: has it started the step\?\)"
}

# peer_lost SIGNAL: the last site's gateway gets SIGNAL while the others
# wait for its ranks in step 2.
peer_lost() {
	local sig=$1 r specs=() t0 lost
	for ((r = 0; r < RANKS; r++)); do specs+=("$last:$r:--late 20000@2"); done
	start_job pl "${specs[@]}"
	wait_for "$work/pl-s0-r0.out" "^step 1 rc=0" 10 || fail "step 1 did not work at site-a"
	sleep 0.3 # the others announce step 2 and wait for the last site
	kill "-$sig" "${gw_pid[$last]}"
	lost=$(now_us)
	local s
	for ((s = 0; s < last; s++)); do
		reported pl "$s" 2 12 "of the lost site"
	done
	local took
	took=$(ms_since "$lost")
	log "  every other site failed step 2 ${took} ms after SIG$sig (heartbeat_timeout $HEARTBEAT_TIMEOUT)"
	within "$took" "${LOST_WITHIN_MS:-6000}" "failing step 2 after the site was lost"
	for ((s = 0; s < last; s++)); do
		expect "$work/pl-s$s-r0.err" "step 2: error -12 \(GG_ERR_SITE\): .*site ${SITES[$last]} is unreachable" \
			"pl-s$s-r0's error names ${SITES[$last]}"
	done
	log "  site-a's rank hears: $(grep -m1 "step 2: error" "$work/pl-s0-r0.err" | cut -c1-300)"
	[ "$sig" = STOP ] || { back_after_kill; return; }
	kill -CONT "${gw_pid[$last]}"
	gw_stop "$last"
	kill -KILL "${rank_pids[@]}" 2>/dev/null || true
	ranks_wait
	# The site comes back, and a new job works everywhere.
	gw_start "$last"
	mesh_up 15
	run_ok after 1000 1 2
}

# restart_last JOB FIRST: SIGKILLs the last site's gateway and starts it
# again; every other site's ranks must report steps FIRST to STEPS of JOB
# within 6 s (none waits out step_timeout), each failed with GG_ERR_SITE
# naming the restart ("site S restarted REASON: ..."), the last site's
# ranks being gone.
restart_last() {
	local job=$1 first=$2 reason=$3 s r t restarted took dead=()
	gw_stop "$last" KILL
	gw_start "$last"
	restarted=$(now_us)
	for ((s = 0; s < last; s++)); do
		for ((r = 0; r < RANKS; r++)); do
			wait_for "$work/$job-s$s-r$r.out" "^step $STEPS rc=" 12 || fail "$job-s$s-r$r did not finish its steps"
		done
	done
	took=$(ms_since "$restarted")
	log "  every other site failed steps $first to $STEPS ${took} ms after the restart"
	within "$took" 6000 "failing the steps after the restart"
	kill -KILL "${rank_pids[@]}" 2>/dev/null || true
	ranks_wait
	for ((r = 0; r < RANKS; r++)); do dead+=("$last:$r"); done
	check_steps "$job" "${dead[@]}"
	for ((t = first; t <= STEPS; t++)); do
		expect_failed "$job" $t -12 "site ${SITES[$last]} restarted $reason: its ranks there lost their sessions" "${dead[@]}"
	done
	mesh_up 15
}

case_peer_restarted() {
	local r specs=()
	STEPS=5
	for ((r = 0; r < RANKS; r++)); do specs+=("$last:$r:--late 20000@2"); done
	start_job pr "${specs[@]}"
	wait_for "$work/pr-s0-r0.out" "^step 1 rc=0" 10 || fail "step 1 did not work at site-a"
	sleep 0.3 # the others announce step 2 and wait for the last site
	restart_last pr 2 "after step 1 of job 'pr'"
	expect_ok pr 1
	# The same before any step completed: the last site's ranks began
	# step 1 (its gateway sent their data) while another site's second
	# rank is 3 s late to it. With 3 sites, site 1's: site 0 fails the
	# steps at once, and site 1, told by site 0's ABORTs, each as its ranks
	# come. With 2, site 0's: its job is not made yet when it hears of the
	# restart, and is ended as it is.
	local late=$((K >= 3 ? 1 : 0))
	start_job prf "$late:1:--late 3000@1"
	[ "$late" = 0 ] || wait_running 0 prf
	wait_running "$last" prf
	sleep 0.3 # the last site's data of step 1 reaches site 0
	restart_last prf 1 "before any step of job 'prf' completed"
	run_ok after 1000 1 2
	# A job that starts while the last site's gateway is down (stopped,
	# or killed) had no part in the gateway that went: the new one's ranks
	# join it, and every step completes, the first one too, which the
	# others began before the new gateway was up.
	local how s i job
	STEPS=3
	for how in TERM KILL; do
		job=down$how
		gw_stop "$last" "$how"
		# Down as the others see it (gradgate status: no stream up to it):
		# a killed gateway's sockets close a few milliseconds after it is
		# gone, and a step begun while a stream to it still seemed up is
		# lost with it.
		for ((s = 0; s < last; s++)); do
			wait_streams "$s" "$last" 0 10 "go (SIG$how)"
		done
		for ((s = 0; s < last; s++)); do
			for ((r = 0; r < RANKS; r++)); do
				rank_start "$job" "$COUNT" "$r" "$RANKS" "$s" "$STEPS" --per-step --check none
			done
		done
		wait_running 0 "$job"
		gw_start "$last"
		for ((r = 0; r < RANKS; r++)); do
			rank_start "$job" "$COUNT" "$r" "$RANKS" "$last" "$STEPS" --per-step --check none
		done
		ranks_wait
		check_steps "$job"
		expect_ok "$job" 1 2 3
		log "  job $job, begun while ${SITES[$last]} was down (SIG$how), completed every step"
		mesh_up 15
	done
}

# The last site's gateway stands still (SIGSTOP) in step 2 while its ranks
# wait; the others fail the step, and the remaining ones, at once, and end
# the job. Resumed, it must hear of that from their END (sent again once
# its streams are back) and fail its ranks' steps at once, not each at the
# 30 s deadline.
# start_a_late JOB: site-a's ranks come a second late to step 2; returns
# once step 1 worked at the last site, whose ranks then go on to step 2.
start_a_late() {
	local r specs=()
	for ((r = 0; r < RANKS; r++)); do specs+=("0:$r:--late 1000@2"); done
	start_job "$1" "${specs[@]}"
	wait_for "$work/$1-s$last-r0.out" "^step 1 rc=0" 10 || fail "step 1 did not work at ${SITES[$last]}"
}

# resume_last JOB STOPPED: the last site's gateway, stopped at STOPPED
# (now_us), runs again 3.5 s after; its ranks must then have every step's
# outcome within 6 s.
resume_last() {
	local resumed took
	while [ "$(ms_since "$2")" -lt 3500 ]; do sleep 0.1; done
	kill -CONT "${gw_pid[$last]}"
	resumed=$(now_us)
	reported "$1" "$last" "$STEPS" 25 "the outcome of its last step"
	took=$(ms_since "$resumed")
	log "  ${SITES[$last]}'s ranks had every step's outcome ${took} ms after it resumed"
	within "$took" 6000 "the resumed site's steps"
}

case_peer_resumed() {
	local s t stopped
	STEPS=5
	start_a_late ps
	sleep 0.2 # the last site's ranks are in step 2, site-a's come a second late
	kill -STOP "${gw_pid[$last]}"
	stopped=$(now_us)
	for ((s = 0; s < last; s++)); do
		reported ps "$s" "$STEPS" 12 "the outcome of its last step"
	done
	resume_last ps "$stopped"
	# It heard nothing while it stood still, which says nothing of its
	# peers: it does not call their streams silent.
	if grep -q 'event=stream_down .*reason="heartbeat timeout"' "$(site_log "$last")"; then
		fail "${SITES[$last]} closed a stream for a heartbeat timeout after it resumed: $(grep -m1 \
			'reason="heartbeat timeout"' "$(site_log "$last")")"
	fi
	ranks_wait
	check_steps ps
	expect_ok ps 1
	# Step 2: the resumed site may hold its result from frames that waited
	# in its sockets; it fails it then for having stood still.
	expect_failed ps 2 -12 "site ${SITES[$last]} (is unreachable|stood still for)"
	for ((t = 3; t <= STEPS; t++)); do
		expect_failed ps $t -12 "site ${SITES[$last]} is unreachable"
	done
	mesh_up 15
	run_ok after 1000 1 2
}

case_peer_paused() {
	local r specs=() stopped resumed took
	for ((r = 0; r < RANKS; r++)); do specs+=("0:$r:--late 6000@2"); done
	start_job pp "${specs[@]}"
	wait_for "$work/pp-s$last-r0.out" "^step 1 rc=0" 10 || fail "step 1 did not work at ${SITES[$last]}"
	sleep 0.3 # the last site's ranks are in step 2, site-a's come 6 s late
	kill -STOP "${gw_pid[$last]}"
	stopped=$(now_us)
	while [ "$(ms_since "$stopped")" -lt 1100 ]; do sleep 0.05; done
	kill -CONT "${gw_pid[$last]}"
	resumed=$(now_us)
	reported pp "$last" 2 10 "the outcome of step 2"
	took=$(ms_since "$resumed")
	log "  ${SITES[$last]}'s ranks had step 2's outcome ${took} ms after its gateway ran again"
	within "$took" 2500 "failing step 2 at the site that stood still, with site-a's ranks still to come"
	ranks_wait
	check_steps pp
	expect_ok pp 1 3
	expect_failed pp 2 -12 "site ${SITES[$last]} stood still for [0-9.]+ s \\(heartbeat_timeout 2s\\) before it had the result"
}

case_peer_gone_after_data() {
	local lost took
	start_a_late pg
	sleep 0.4 # the last site's ranks are in step 2 and its data went out; site-a's come a second late
	kill -KILL "${gw_pid[$last]}"
	lost=$(now_us)
	reported pg 0 2 12 "of the lost site"
	took=$(ms_since "$lost")
	log "  site-a failed step 2 ${took} ms after SIGKILL (heartbeat_timeout 2 s, step_timeout 30 s)"
	within "$took" 6000 "failing step 2 with the result held and the DONE undelivered"
	expect "$work/pg-s0-r0.err" "step 2: error -12 \(GG_ERR_SITE\): .*site ${SITES[$last]} is unreachable.*no stream carried its DONE" \
		"pg-s0-r0's error names ${SITES[$last]} and the undelivered DONE"
	log "  site-a's rank hears: $(grep -m1 "step 2: error" "$work/pg-s0-r0.err" | cut -c1-300)"
	back_after_kill
}

case_peer_stopped_after_data() {
	local r specs=() stopped
	for ((r = 0; r < RANKS; r++)); do specs+=("0:$r:--late 1000@2 --timeout-ms 600 --inflight 2"); done
	start_job psd "${specs[@]}"
	wait_for "$work/psd-s$last-r0.out" "^step 1 rc=0" 10 || fail "step 1 did not work at ${SITES[$last]}"
	sleep 0.4 # the last site's ranks are in step 2 and its data went out; site-a's come a second late
	kill -STOP "${gw_pid[$last]}"
	stopped=$(now_us)
	reported psd 0 2 12 "the outcome of step 2"
	log "  site-a had step 2's outcome $(ms_since "$stopped") ms after the last site stopped"
	resume_last psd "$stopped"
	ranks_wait
	check_steps psd
	expect_ok psd 1
	expect_failed psd 2 -12 "site (site-a had the result, but site ${SITES[$last]} never said so too|${SITES[$last]} stood still for [0-9.]+ s)"
	expect "$work/psd-s$last-r0.err" "step 2: error -12 .*site ${SITES[$last]} stood still for [0-9.]+ s \(heartbeat_timeout 2s\) before it had the result" \
		"the resumed site's rank hears that its gateway stood still"
	# Site-a's step 3, announced with step 2, waited behind it past its
	# deadline, for the lost site: that is its cause, at every site.
	expect_failed psd 3 -12 "site ${SITES[$last]} is unreachable"
	expect "$work/psd-s0-r0.err" "step 3: error -12 .*the deadline of 600 ms passed before the step could start .*: site ${SITES[$last]} is unreachable" \
		"site-a's rank hears why step 3 could not start"
	mesh_up 15
	run_ok after 1000 1 2
}

case_peer_terminated() {
	local r s specs=() lost took
	for ((r = 0; r < RANKS; r++)); do specs+=("$last:$r:--late 20000@2"); done
	start_job pt "${specs[@]}"
	wait_for "$work/pt-s0-r0.out" "^step 1 rc=0" 10 || fail "step 1 did not work at site-a"
	sleep 0.3 # the others announce step 2 and wait for the last site
	lost=$(now_us)
	gw_signal "$last" TERM
	for ((s = 0; s < last; s++)); do
		reported pt "$s" 2 12 "of the stopped site"
	done
	took=$(ms_since "$lost")
	# Its exit is not timed: a sanitizer's report at exit may take long.
	gw_reap "$last" TERM
	[ "$reaped" = 0 ] || fail "${SITES[$last]} exited $reaped on SIGTERM"
	log "  every other site failed step 2 ${took} ms after SIGTERM (heartbeat_timeout 2 s)"
	within "$took" 1000 "failing step 2 after the site said it stops"
	for ((s = 0; s < last; s++)); do
		expect "$work/pt-s$s-r0.err" \
			"step 2: error -11 \(GG_ERR_RANK\): .*site ${SITES[$last]} ended job 'pt' .*: its ranks there are gone: the gateway of site ${SITES[$last]} is shutting down" \
			"pt-s$s-r0's error names ${SITES[$last]} shutting down"
	done
	log "  site-a's rank hears: $(grep -m1 "step 2: error" "$work/pt-s0-r0.err" | cut -c1-300)"
	kill -KILL "${rank_pids[@]}" 2>/dev/null || true
	ranks_wait
	gw_start "$last"
	mesh_up 15
	run_ok after 1000 1 2
}

case_peer_killed() { peer_lost KILL; }
case_peer_stopped() { peer_lost STOP; }
case_peer_stopped_fast() { peer_lost STOP; }

case_job_end() {
	# 9 Mi int8 elements keep 36 MiB of residuals per site: two jobs'
	# would not fit in 64 MiB.
	local j
	for j in 1 2 3; do
		run_ok "end$j" $((9 << 20)) 1 1 -- --data gaussian --check first
	done
	for ((s = 0; s < K; s++)); do
		expect "$(site_log "$s")" "event=job_ended job=end2" "${SITES[$s]} ended job end2"
	done
	# Once every rank of a run is gone, its name may start a new run.
	run_ok end1 1000 1 2 -- --data gaussian --check first
}

for config in "$@"; do
	K=${config%%:*}
	ALGO=${config#*:}
	last=$((K - 1))
	CODEC=fp32
	MEMORY=2GiB
	if [ "$fault" = job-end ]; then
		CODEC=int8
		MEMORY=64MiB
	fi
	# Links that can be stopped, for an outage that leaves the gateways up.
	[ "$fault" = ranks-gone-unheard ] || [ "$fault" = link-one-way ] && LINK_ARGS=(--delay-ms 0)
	if [ "$fault" = peer-stopped-fast ]; then
		HEARTBEAT_INTERVAL=50ms HEARTBEAT_TIMEOUT=200ms LOST_WITHIN_MS=1500
	fi
	log "$fault: $K sites, $ALGO"
	mesh_start
	mesh_up 15
	"case_${fault//-/_}"
	mesh_stop
done
