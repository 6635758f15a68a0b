#!/usr/bin/env bash
# The daemon's signals: SIGHUP reloads the certificates and key (and keeps
# the old ones when the new ones cannot be loaded, or the peers would
# refuse them; and says when the config file changed, which it does not
# read again) without disturbing the mesh; SIGTERM and SIGINT stop it cleanly, also with a step in progress:
# status 0, 'stopped' in the log, the step failed at its rank with a
# reason, close_notify to the peers, the control socket removed.
#
#   signals.sh [THREADS]   the gateways' [site] threads (default 2)
. "$(dirname "$0")/lib.sh"

K=2
THREADS=${1:-2}
mesh_start
mesh_up 15
run_ok before 1000 1 1

key="$work/certs/site-a.key"
mv "$key" "$key.away"
kill -HUP "${gw_pid[0]}"
wait_for "$(site_log 0)" 'event=reload_failed .*kept="previous credentials"' 10 ||
	fail "site-a did not report the failed reload"
mv "$key.away" "$key"
kill -HUP "${gw_pid[0]}"
wait_for "$(site_log 0)" 'event=reloaded what=certificates' 10 || fail "site-a logged no 'reloaded'"
run_ok reloaded 1000003 1 1
# site-b's certificate and key in site-a's files: they load, but every peer
# would refuse them as site-a's.
for f in pem key; do cp -p "$work/certs/site-a.$f" "$work/certs/site-a.$f.own"; done
cp -p "$work/certs/site-b.pem" "$work/certs/site-a.pem"
cp -p "$work/certs/site-b.key" "$work/certs/site-a.key"
kill -HUP "${gw_pid[0]}"
wait_for "$(site_log 0)" 'event=reload_failed .*names peer site-b \(dns:site-b\.gradgate\.test\).*kept="previous credentials"' 10 ||
	fail "site-a did not refuse site-b's certificate as its own"
for f in pem key; do mv "$work/certs/site-a.$f.own" "$work/certs/site-a.$f"; done
run_ok kept 1000 1 1
# Files the peers would refuse though they name no peer: the certificate of
# a site this config does not know, from the same CA; and another
# deployment's CA, certificate and key for site-a, which load together.
"$MAKE_CERTS" --out "$work/certs" site-x >/dev/null
"$MAKE_CERTS" --out "$work/other" site-a >/dev/null
for f in pem key; do cp -p "$work/certs/site-a.$f" "$work/certs/site-a.$f.own"; done
cp -p "$work/certs/ca.pem" "$work/certs/ca.pem.own"
cp -p "$work/certs/site-x.pem" "$work/certs/site-a.pem"
cp -p "$work/certs/site-x.key" "$work/certs/site-a.key"
kill -HUP "${gw_pid[0]}"
wait_for "$(site_log 0)" "event=reload_failed .*does not name dns:site-a\.gradgate\.test( or [^ ]+)*, as the certificate in use does.*kept=\"previous credentials\"" 10 ||
	fail "site-a took an unknown site's certificate as its own"
for f in ca.pem site-a.pem site-a.key; do cp -p "$work/other/$f" "$work/certs/$f"; done
kill -HUP "${gw_pid[0]}"
wait_for "$(site_log 0)" "event=reload_failed .*site-a\.pem' does not pass the checks of the CA file in use.*kept=\"previous credentials\"" 10 ||
	fail "site-a took another deployment's credentials"
for f in pem key; do mv "$work/certs/site-a.$f.own" "$work/certs/site-a.$f"; done
mv "$work/certs/ca.pem.own" "$work/certs/ca.pem"
# The config file edited, then SIGHUP: its settings are read at start
# only, which the gateway says.
sed -i 's/^chunk_size = .*/chunk_size = "2MiB"/' "$work/site-a.toml"
kill -HUP "${gw_pid[0]}"
wait_for "$(site_log 0)" "event=config_changed path=\"$work/site-a\\.toml\" reason=\".*restart the gateway to apply the rest\"" 10 ||
	fail "site-a did not say that SIGHUP leaves its edited config file unread"
# Its streams cut, site-a dials again with what it kept: the mesh comes back.
gw_stop 1 KILL
gw_start 1
mesh_up 15
run_ok after-refused 1000 1 1

# SIGTERM while site-a's rank waits in a step (site-b has no ranks).
ranks_start pending 1000 1 1 0
wait_for "$(site_log 0)" "rank 0 of job 'pending' connected" 10 || fail "the rank did not connect"
# Connected is not yet stepping: wait until the step reached the core, which
# `gradgate status` shows as the job running.
wait_running 0 pending
pid=${gw_pid[0]}
stop_at=${EPOCHREALTIME/[.,]/}
gw_stop 0 TERM
stop_ms=$(((${EPOCHREALTIME/[.,]/} - stop_at) / 1000))
[ "$reaped" = 0 ] || fail "site-a exited $reaped on SIGTERM"
log "site-a stopped in ${stop_ms} ms"
# The held step fails at once and its peers let its frames go: no waiting
# out the 2 s drain for frames nobody will take.
[ "$stop_ms" -lt 1000 ] || fail "site-a took ${stop_ms} ms to stop with a step pending"
expect "$(site_log 0)" "event=stopping site=site-a" "site-a's log"
expect "$(site_log 0)" "event=stopped site=site-a steps_done=4 steps_failed=1" "site-a's log"
# The streams it closes itself as it stops are news, not warnings.
expect "$(site_log 0)" 'level=info event=stream_down site=site-b stream=[0-9]+ reason="shutting down"' "site-a's log"
expect_none "$(site_log 0)" 'level=warn event=stream_down [^"]*reason="shutting down"' "site-a's log"
ranks_wait
[ "${rank_rc[pending-s0-r0]}" = 1 ] || fail "the pending rank exited ${rank_rc[pending-s0-r0]}, expected 1"
expect "$work/pending-s0-r0.err" "step 1 .*(site-a is shutting down|closed the connection)" "the pending rank's error"
log "pending rank: $(cat "$work/pending-s0-r0.err")"
[ ! -e "$work/site-a.sock" ] || fail "site-a left its control socket behind"
wait_for "$(site_log 1)" 'event=stream_down site=site-a .*reason="the peer closed the stream"' 10 ||
	fail "site-b did not see a clean close from site-a"
expect_none "$(site_log 1)" 'without close_notify' "site-b"

# SIGINT stops site-b the same way; more signals once it is stopping
# change nothing.
gw_signal 1 INT
wait_for_since "$(site_log 1)" 'event=stopping site=site-b' 10 || fail "site-b logged no 'stopping' on SIGINT"
gw_signal 1 TERM
gw_signal 1 INT
gw_reap 1 INT
[ "$reaped" = 0 ] || fail "site-b exited $reaped on SIGINT, SIGTERM and SIGINT"
expect "$(site_log 1)" "event=stopped site=site-b" "site-b's log"
n=$(since_start "$(site_log 1)" | grep -c 'event=stopping site=site-b' || true)
[ "$n" = 1 ] || fail "site-b logged 'stopping' $n times for three signals"
[ ! -e "$work/site-b.sock" ] || fail "site-b left its control socket behind"

# Site-b with another deployment's CA and certificate: each site refuses
# the other's certificate, for good. A dial that fails at the certificate
# is a warning (no retry mends it), unlike one that finds its peer down.
"$MAKE_CERTS" --out "$work/other" site-b >/dev/null
sed -i "s#^ca = .*#ca = \"$work/other/ca.pem\"#; s#^cert = .*#cert = \"$work/other/site-b.pem\"#; s#^key = .*#key = \"$work/other/site-b.key\"#" \
	"$work/site-b.toml"
gw_start 0
gw_start 1
for i in 0 1; do
	wait_for_since "$(site_log "$i")" "level=warn event=stream_down site=${SITES[1 - i]} stream=[0-9]+ reason=\"[^\"]*certificate" 10 ||
		fail "${SITES[$i]} did not warn that its dial failed at the certificates"
done
log "another CA: $(since_start "$(site_log 0)" | grep -m1 -o 'level=warn event=stream_down.*')"
mesh_stop
