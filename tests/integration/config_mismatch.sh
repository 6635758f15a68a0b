#!/usr/bin/env bash
# Gateways whose configurations disagree on what both sides must share
# (codec, block scale, algorithm) refuse to form the mesh: both log
# peer_mismatch naming both values, and no mesh_up. Fixing the config and
# restarting one side brings the mesh up. A setting that need not agree,
# inflight_per_peer, does not keep steps from completing.
. "$(dirname "$0")/lib.sh"

K=2

# check_refused WHAT A_SEES B_SEES [STEP]: starts the mesh as configured,
# expects each side to log the mismatch as given, and no mesh; with STEP,
# a rank's step at site-a to fail at its deadline naming the mismatch as
# why site-b sent nothing; stops it.
check_refused() {
	local what=$1 a_sees=$2 b_sees=$3 i
	mesh_start
	wait_for_since "$(site_log 0)" "event=peer_mismatch site=site-b reason=\"$a_sees\"" 10 ||
		fail "$what: site-a logged no mismatch naming both values"
	wait_for_since "$(site_log 1)" "event=peer_mismatch site=site-a reason=\"$b_sees\"" 10 ||
		fail "$what: site-b logged no mismatch naming both values"
	for i in 0 1; do
		! wait_for_since "$(site_log "$i")" 'event=mesh_up' 0 || fail "$what: ${SITES[$i]} formed a mesh"
	done
	log "$what: $(since_start "$(site_log 1)" | grep -m1 -o 'reason=.*')"
	if [ -n "${4:-}" ]; then
		rank_start "$4" 1000 0 1 0 1 --timeout-ms 1500
		ranks_wait
		[ "${rank_rc[$4-s0-r0]}" = 1 ] || fail "$what: site-a's rank exited ${rank_rc[$4-s0-r0]}, not 1"
		expect "$work/$4-s0-r0.err" "step 1 of job '$4' missed its 1500ms deadline: site site-b never sent [a-z-]+ data for shard 0 chunk 0 \\(no connection to it: $a_sees\\)" \
			"$what: the step's error at site-a"
		log "$what: $(cat "$work/$4-s0-r0.err")"
	fi
	mesh_stop
}

CODEC=fp32
SITE_CODEC[1]=int8
check_refused codec "peer site-b uses codec int8, this site uses fp32" "peer site-a uses codec fp32, this site uses int8" \
	codec-step

SITE_CODEC=()
CODEC=int8
SITE_SCALE[1]=fp16
check_refused "block scales" "peer site-b uses block scales fp16, this site uses fp32" \
	"peer site-a uses block scales fp32, this site uses fp16"

SITE_SCALE=()
CODEC=fp32
SITE_ALGO[1]=direct
check_refused algorithm "peer site-b uses all-reduce algorithm direct, this site uses ring" \
	"peer site-a uses all-reduce algorithm ring, this site uses direct"

# Agreeing configs: the mesh forms and carries a step.
SITE_ALGO=()
mesh_start
mesh_up 15
run_ok agreed 1000 1 1

# inflight_per_peer need not agree: site-b keeps 256KiB of early frames
# (and a frame per stream), site-a sends up to 8MiB ahead. Each sends
# within the smaller; where site-a kept to its own, site-b refused its
# frames for a step whose rank there is late, and the step waited for
# its deadline.
gw_stop 1
sed -i 's/^inflight_per_peer = .*/inflight_per_peer = "256KiB"/' "$work/site-b.toml"
gw_start 1
mesh_up 15
ranks_start windows 2097152 1 4 0
ranks_start windows 2097152 1 4 1 -- --late 1500@2
check_ranks
log "ok: job windows, site-b's rank late to step 2: digest $checked_digest"
expect_none "$(site_log 1)" 'event=early_data_refused' "site-b kept site-a's early frames"
mesh_stop
