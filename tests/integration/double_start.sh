#!/usr/bin/env bash
# A second gateway started by mistake beside a running one, with its
# config, must fail to start and leave the running one alone. Before it
# knew it could not start (its port, control socket or metrics port is
# the running gateway's), it had already dialed the peers as the site with
# a new instance id: site-b took that for a restart of site-a and failed
# the job running there, at every later step. Here a job stands in the
# middle of a step (site-a's rank announces it 6 s late) while three such
# gateways start and fail: one with site-a's whole config, one with its
# own port but site-a's control socket, one with its own port and socket
# but site-a's metrics port. Each must exit 3 with its reason, site-b
# must see no restart and no stream of site-a's go down, and the job must
# complete with the right sums.
. "$(dirname "$0")/lib.sh"

K=2
METRICS=1
mesh_start
mesh_up 10
read -r -a spare <<<"$(free_ports 3)"

# start_copy NAME SED-SCRIPT REASON: runs site-a's config, changed by
# SED-SCRIPT, as a second gateway; it must exit 3 logging REASON.
start_copy() {
	local name=$1 changes=$2 reason=$3 rc=0
	sed -e "$changes" "$work/site-a.toml" >"$work/$name.toml"
	chmod 600 "$work/$name.toml"
	timeout 20 "$GRADGATE" --config "$work/$name.toml" 2>"$work/$name.log" || rc=$?
	[ "$rc" = 3 ] || fail "the copy of site-a with $name exited $rc, not 3: $(cat "$work/$name.log")"
	grep -Eq "event=startup_failed site=site-a reason=\"$reason" "$work/$name.log" ||
		fail "the copy of site-a with $name did not say why it could not start: $(cat "$work/$name.log")"
	log "copy with $name: $(grep -o 'reason=.*' "$work/$name.log" | cut -c1-160)"
}

from_b=$(grep -c '' "$(site_log 1)")
from_a=$(grep -c '' "$(site_log 0)")
ranks_start ds 65536 1 6 0 -- --late 6000@3
ranks_start ds 65536 1 6 1
sleep 1 # steps 1 and 2 done, step 3 begun at site-b alone

start_copy same-config '' "cannot listen on 127\\.0\\.0\\.1:[0-9]+: Address already in use; a gateway with this config's control socket runs \\(pid ${gw_pid[0]}\\): stop it first\""
# (The first listen line is [site]'s, the last [metrics]'.)
start_copy same-control "0,/^listen = .*/s//listen = \"127.0.0.1:${spare[0]}\"/; \$s/:[0-9]*\"\$/:${spare[2]}\"/" \
	'control socket [^ ]+: another gateway holds it \(pid [0-9]+\)'
start_copy same-metrics "0,/^listen = .*/s//listen = \"127.0.0.1:${spare[1]}\"/; s#^control = .*#control = \"unix:$work/copy.sock\"#" \
	'\[metrics\] listen 127\.0\.0\.1:[0-9]+: '

alive "${rank_pids[0]}" || fail "the job ended before the copies had all tried to start"
check_ranks
log "ok: job ds completed with digest $checked_digest while three copies of site-a failed to start"
# Where both sites dial, a pair of connections for one stream may settle
# after mesh_up, one closed as a duplicate: the mesh's own doing.
tail -n +"$from_b" "$(site_log 1)" | grep -v 'reason="duplicate stream' >"$work/b-after.log" || true
tail -n +"$from_a" "$(site_log 0)" | grep -v 'reason="duplicate stream' >"$work/a-after.log" || true
expect_none "$work/b-after.log" 'event=(peer_restarted|site_claimed_twice|stream_down site=site-a|step_failed)' \
	"site-b saw nothing of the copies"
expect_none "$work/a-after.log" 'event=(stream_down|step_failed)' "site-a's streams stayed up"
