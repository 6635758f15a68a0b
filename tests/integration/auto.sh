#!/usr/bin/env bash
# [allreduce] algorithm = "auto": three sites on loopback choose direct or
# ring per step from the links they measured, and always the same one.
#
# A job's first steps go direct (no plan yet). Once the streams have
# delivered a quarter second's worth of DATA, and eight steps more warmed
# the links, the first site's DONE carries a plan
# from the measured uplink and round trip and from the steps timed so far
# (which of the two wins for a large step on loopback, where the CPU sets
# the pace, is up to the moment; a one-element step stays direct). Every
# site logs the same choices at the same steps with the same figures, and
# every step's result is exact and identical everywhere. With 1 MiB chunks
# configured, the job's 4 MB steps go in 1 MiB chunks either way, as the
# lines that log a choice say: by ring their shards are too small for four
# of the 512 KiB chunks auto would cut them in (test_node_mesh checks a
# step that is cut, in the chunks it ran in).
. "$(dirname "$0")/lib.sh"
CHUNK=1MiB

K=3
ALGO=auto
mesh_start
mesh_up 15

# The algorithm lines of job $1 at site $2, without the time stamp and
# the model's times (each site counts its own frames' bytes per element).
choices() {
	grep "event=algorithm job=$1 " "$(site_log "$2")" | sed 's/^ts=[^ ]* //; s/ model_direct_ms=.*//'
}

run_ok big 1000000 1 40
first=$(choices big 0)
log "site-0 chose: $(tr '\n' '|' <<<"$first")"
grep -q 'step=1 algorithm=direct count=1000000 chunk_kib=1024 reason="no plan yet: the links are measured as steps go direct"' <<<"$first" ||
	fail "site-0 did not start job big direct, for want of a plan: $first"
grep -Eq 'algorithm=(direct|ring) count=1000000 chunk_kib=1024 direct_up_to=([0-9]+|any) uplink_mbit=[0-9.]+ rtt_ms=[0-9.]+ model_direct_ms=[0-9.]+ model_ring_ms=[0-9.]+ factor_direct=[0-9.]+ factor_ring=[0-9.]+$' "$(site_log 0)" ||
	fail "site-0 logged no plan for job big with the figures behind it: $first"
# The first eight steps once the links are measured warm them, direct.
plan_step=$(grep -m1 -o 'step=[0-9]* algorithm=[a-z]* count=1000000 chunk_kib=[0-9]* direct_up_to=' <<<"$first" | grep -o '[0-9]*' | head -1)
[ "${plan_step:-0}" -ge 9 ] || fail "job big had a plan at step ${plan_step:-?}, before its links warmed up: $first"
for ((i = 1; i < K; i++)); do
	[ "$(choices big $i)" = "$first" ] || fail "site $i chose differently from site 0: $(choices big $i)"
done
! grep -Ev 'algorithm=(direct|ring) count=1000000 chunk_kib=1024 ' <<<"$first" ||
	fail "job big's steps were not cut as auto cuts them (1024 KiB): $first"

# A new job starts direct; its steps of one element stay direct (the
# plan's line when it first comes says so), the same at every site.
run_ok small 1 1 20
small=$(choices small 0)
grep -q 'step=1 algorithm=direct count=1 ' <<<"$small" || fail "job small did not start direct: $small"
! grep -q 'algorithm=ring' <<<"$small" || fail "a one-element step went by ring: $small"
for ((i = 1; i < K; i++)); do
	[ "$(choices small $i)" = "$small" ] || fail "site $i chose differently for job small: $(choices small $i)"
done

# Sites whose algorithm settings differ do not connect (HELLO).
mesh_stop
SITE_ALGO[2]=ring
mesh_start
wait_for_since "$(site_log 2)" 'event=peer_mismatch site=site-a reason="peer site-a uses all-reduce algorithm auto, this site uses ring"' 10 ||
	fail "site 2 with ring did not refuse site-a with auto"
! wait_for_since "$(site_log 2)" 'event=mesh_up' 0 || fail "site 2 with ring formed a mesh with sites on auto"
mesh_stop
