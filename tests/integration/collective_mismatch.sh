#!/usr/bin/env bash
# Two sites announce different collectives for the same step (site-b's
# ranks all-reduce one element more): the step fails at both sites, at
# every rank, with a message naming both announcements.
. "$(dirname "$0")/lib.sh"

K=2
STEP_TIMEOUT=5s
mesh_start
mesh_up 15
ranks_start differ 1000 2 1 0
ranks_start differ 1001 2 1 1
ranks_wait
for s in 0 1; do
	for r in 0 1; do
		name=differ-s$s-r$r
		[ "${rank_rc[$name]}" = 1 ] || fail "$name exited ${rank_rc[$name]}, expected 1"
		expect "$work/$name.err" "step 1 .*announced tensor 1 with 100[01] elements.*tensor 1 with 100[01] elements" \
			"$name's error names both announcements"
		grep -q 1000 "$work/$name.err" && grep -q 1001 "$work/$name.err" ||
			fail "$name's error does not name both sizes: $(cat "$work/$name.err")"
	done
	expect "$(site_log "$s")" "event=step_failed job=differ step=1 .*1001 elements.*" "${SITES[$s]}'s log"
done
log "site-a: $(cat "$work/differ-s0-r0.err")"
log "site-b: $(cat "$work/differ-s1-r0.err")"
# The mesh goes on: the next job with agreeing sizes works.
run_ok agree 1000 2 2
mesh_stop
