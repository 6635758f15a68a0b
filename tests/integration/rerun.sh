#!/usr/bin/env bash
# A job name is one training run (README, "host mode"): while a rank of the
# old run is still connected at some site, the gateways refuse step 1 of a
# new run under that name, saying so, at once rather than at its deadline.
#
# Site-a's rank of job 'train' runs 3 steps and closes; site-b's rank of
# the same run stays (it waits before its step 4). A new run of 'train' at
# both sites then fails step 1, well before step_timeout, every rank's
# error naming the old run at site-b; site-b's old rank then fails its
# step 4, site-a's run being over. After that, with every rank gone, the
# name starts a new run that works.
. "$(dirname "$0")/lib.sh"

K=2
STEP_TIMEOUT=20s

# new_run_refused JOB COUNT SITE REGEX: a new run of JOB (one rank, COUNT
# elements) at site SITE fails its step 1 within 10 s, well before its
# 15 s deadline, with an error matching REGEX; and its steps 2 and 3, which
# cannot run either, fail at once too, saying why.
new_run_refused() {
	local t0=${EPOCHREALTIME/[.,]/} new ms t
	rank_start "$1" "$2" 0 1 "$3" 3 --timeout-ms 15000
	new=${rank_pids[-1]}
	wait_exit "$new" 10 || fail "the steps of a new run of '$1' at ${SITES[$3]} were not refused within 10 s"
	ms=$(((${EPOCHREALTIME/[.,]/} - t0) / 1000))
	reap "$new"
	unset 'rank_pids[-1]' 'rank_names[-1]' # reaped: not for ranks_wait
	[ "$reaped" != 0 ] || fail "step 1 of a new run of '$1' completed while the old one still runs"
	expect "$work/$1-s$3-r0.err" "$4" "the new run's error at ${SITES[$3]}"
	for t in 2 3; do
		expect "$work/$1-s$3-r0.err" "step $t: error -5 \\(GG_ERR_REFUSED\\): step $t \\(tensor 1\\): step 1 of this run was refused: a job name is one training run, and site site-. still runs the old one" \
			"the new run's step $t at ${SITES[$3]}"
	done
	log "new run of '$1' ($2 elements) refused after $ms ms: $(cat "$work/$1-s$3-r0.err")"
}
mesh_start
mesh_up 15

rank_start train 1000 0 1 0 3
rank_start train 1000 0 1 1 4 --late 8000@4
wait_for "$work/train-s0-r0.out" 'digest=' 15 || fail "site-a's rank of the first run did not finish"
# Site-b's rank is now connected and idle before its step 4. The new run:
# site-b has a second job of the name only once its first rank leaves, so
# the new run's rank there waits in the gateway for step 1 like site-a's.
new_run_refused train 1000 0 "step 1: error -5 \(GG_ERR_REFUSED\): .*site site-b aborted step 1 of job 'train': a job name is one training run, and site site-b still runs the old one \(at step 3\): use a new name, or wait until its ranks are all gone$"
expect "$(site_log 1)" "event=rerun_refused site=site-a job=train" "site-b's log"

ranks_wait
[ "${rank_rc[train-s1-r0]}" != 0 ] || fail "site-b's old rank completed step 4 with site-a's run over"
expect "$work/train-s1-r0.err" "step 4 .*site site-a ended job 'train' after step 3" "site-b's old rank's error"
log "old run at site-b: $(cat "$work/train-s1-r0.err")"

# Every rank of the old run is gone: the name is free for a new run.
run_ok train 1000 1 2

# 8 elements, under 32 a site: the shard site-b starts by ring is empty,
# so a new run's step 1 there sends site-a nothing before site-a's frames
# come. Site-b refuses it itself, as site-a's old run never said it ended.
rank_start tiny 8 0 1 0 2 --late 8000@2
rank_start tiny 8 0 1 1 1
wait_for "$work/tiny-s1-r0.out" 'digest=' 15 || fail "site-b's rank of the first tiny run did not finish"
wait_for "$(site_log 0)" 'event=peer_job_ended site=site-b job=tiny ' 10 || fail "site-a did not hear site-b's END"
new_run_refused tiny 8 1 "step 1: error -5 \(GG_ERR_REFUSED\): step 1 \(tensor 1\): step 1 of job 'tiny': a job name is one training run, and site site-a still runs the old one \(as far as site site-b heard\): use a new name, or wait until its ranks are all gone$"
ranks_wait
# The old run, past its step 1, heard that refusal too: it is not its own,
# and its step 2 fails for what really ended it.
expect "$work/tiny-s0-r0.err" "step 2: error -11 \(GG_ERR_RANK\): .*site site-b ended job 'tiny' after step 1" \
	"the old run's step 2 at site-a"
mesh_stop

# Three sites by ring, where site-b hears only site-a's frames: site-c's
# rank leaves after step 2, so site-a's step 3 fails and its rank leaves
# after, and site-c's END reaches site-b before site-a's. A new run at
# site-a and site-c must be refused all the same (site-b once took only
# the site of the first END for over, and let the new run wait out its
# deadline).
K=3
mesh_start
mesh_up 15
rank_start rerun3 1000 0 1 0 3
old_a=${rank_pids[-1]}
rank_start rerun3 1000 0 1 1 3 --late 3000@3
rank_start rerun3 1000 0 1 2 2
wait_exit "$old_a" 15 || fail "site-a's rank of the first run did not end"
reap "$old_a"
expect "$work/rerun3-s0-r0.err" "step 3 .*site site-c ended job 'rerun3' after step 2" "site-a's old rank's error"
sleep 0.3
t0=${EPOCHREALTIME/[.,]/}
news=()
for s in 0 2; do
	rank_start rerun3 1000 0 1 "$s" 1 --timeout-ms 15000
	news+=("${rank_pids[-1]}")
done
for pid in "${news[@]}"; do
	wait_exit "$pid" 10 || fail "step 1 of the new run was not refused within 10 s (step_timeout is $STEP_TIMEOUT)"
	reap "$pid"
	[ "$reaped" != 0 ] || fail "step 1 of a new run of 'rerun3' completed while site-b still runs the old one"
done
ms=$(((${EPOCHREALTIME/[.,]/} - t0) / 1000))
for s in 0 2; do
	expect "$work/rerun3-s$s-r0.err" "step 1: error -5 \(GG_ERR_REFUSED\): .*site site-b still runs the old one" \
		"the new run's error at ${SITES[$s]}"
done
log "3 sites: new run refused after $ms ms: $(cat "$work/rerun3-s0-r0.err")"
ranks_wait
mesh_stop
