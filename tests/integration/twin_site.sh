#!/usr/bin/env bash
# Two gateways run as one site: a second site-a, with site-a's certificate
# and key but its own port and control socket, joins a running mesh. The
# two take each other's streams to site-b, each time with a new instance
# id, which reads as a restart of site-a. site-b must say what it is: a
# site_claimed_twice line naming site-a and both instances, and steps that
# fail with "two gateways run as site site-a at once", not "site site-a
# restarted", which would send an operator looking for a crash.
. "$(dirname "$0")/lib.sh"

K=2
mesh_start
read -r twin_port <<<"$(free_ports 1)"
sed -e "s/^listen = .*/listen = \"127.0.0.1:$twin_port\"/" -e "s#^control = .*#control = \"unix:$work/twin.sock\"#" \
	"$work/site-a.toml" >"$work/twin.toml"
chmod 600 "$work/twin.toml"
"$GRADGATE" --config "$work/twin.toml" 2>"$work/twin.log" &
twin=$!
pids+=("$twin")
wait_for "$(site_log 1)" 'event=site_claimed_twice site=site-a instances=[0-9a-f]{16},[0-9a-f]{16} ' 15 ||
	fail "site-b did not tell two gateways of site-a from restarts: $(grep -c peer_restarted "$(site_log 1)") peer_restarted lines"
log "site-b: $(grep -m1 -o 'event=site_claimed_twice.*' "$(site_log 1)")"

# A job that starts now fails at site-b for what it is. Its steps take a
# fraction of a millisecond, and the two gateways take the streams from
# each other a few times a second: the job runs until a step meets that
# (1000 steps could all end between two takeovers), and is killed then.
rank_start tw 1000 0 1 0 200000 --per-step --check none
rank_start tw 1000 0 1 1 200000 --per-step --check none
wait_for "$work/tw-s1-r0.err" 'error -12 \(GG_ERR_SITE\): .*two gateways run as site site-a at once' 20 ||
	fail "site-b's rank was not told of two gateways: $(grep -m3 error "$work/tw-s1-r0.err")"
log "site-b's rank hears: $(grep -m1 'two gateways' "$work/tw-s1-r0.err" | cut -c1-300)"
if grep -q 'site site-a restarted' "$work/tw-s1-r0.err"; then
	fail "site-b's rank was told site-a restarted: $(grep -m1 'restarted' "$work/tw-s1-r0.err")"
fi
kill -KILL "$twin" "${rank_pids[@]}" 2>/dev/null || true
