#!/usr/bin/env bash
# Local clients that fail: a rank killed (SIGKILL) mid-step fails its job's
# other ranks with an error naming it; ranks of one site that announce
# different sizes, and a client that sends garbage, are refused with a
# reason. Through all of it the gateway keeps serving new sessions, more
# jobs than it has job slots among them.
. "$(dirname "$0")/lib.sh"

K=2
STEP_TIMEOUT=4s
mesh_start
mesh_up 15

# Three ranks at site-a announce step 1, which then waits for site-b's
# data (site-b has no ranks yet); rank 2 dies meanwhile.
ranks_start victim 1000 3 1 0
for r in 0 1 2; do
	wait_for "$(site_log 0)" "rank $r of job 'victim' connected" 10 || fail "rank $r did not connect"
done
victim=${rank_pids[2]}
[ "${rank_names[2]}" = victim-s0-r2 ] || fail "unexpected rank order: ${rank_names[*]}"
kill -KILL "$victim"
killed_at=${EPOCHREALTIME/[.,]/}
ranks_wait
waited_ms=$(((${EPOCHREALTIME/[.,]/} - killed_at) / 1000))
[ "${rank_rc[victim-s0-r2]}" = 137 ] || fail "rank 2 exited ${rank_rc[victim-s0-r2]}, not by SIGKILL"
for r in 0 1; do
	name=victim-s0-r$r
	[ "${rank_rc[$name]}" = 1 ] || fail "$name exited ${rank_rc[$name]}, expected 1"
	expect "$work/$name.err" "step 1 .*rank 2 of job 'victim' (disconnected|lost its connection)" \
		"$name's error names rank 2"
done
log "rank 0: $(cat "$work/victim-s0-r0.err")"
# The job fails at once, not at the step's deadline.
[ "$waited_ms" -lt 3000 ] || fail "the other ranks took ${waited_ms} ms to fail"
expect "$(site_log 0)" "rank 2 of job 'victim' (disconnected|lost its connection)" "site-a's log names rank 2"

# Ranks of one site that disagree on the size: both fail, naming both.
rank_start sizes 1000 0 2 0 1
rank_start sizes 1001 1 2 0 1
ranks_wait
for r in 0 1; do
	[ "${rank_rc[sizes-s0-r$r]}" = 1 ] || fail "sizes-s0-r$r exited ${rank_rc[sizes-s0-r$r]}, expected 1"
	expect "$work/sizes-s0-r$r.err" "ranks of site site-a disagree: rank 0 announced tensor 1 \\(1000 .*rank 1 announced tensor 1 \\(1001 " \
		"sizes-s0-r$r's error names both sizes"
done

# A client that sends garbage instead of a HELLO is refused and logged.
python3 - "$work/site-a.sock" <<'PY'
import os, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.settimeout(10)
s.connect(sys.argv[1])
s.send(os.urandom(96))
answer = s.recv(4096)  # REFUSE or ERROR, then the gateway closes
assert answer, "no answer to garbage"
assert s.recv(4096) == b"", "the gateway kept the connection"
PY
wait_for "$(site_log 0)" "control connection [0-9]+ refused" 5 || fail "site-a did not log the garbage client"

# The step the dead rank left behind fails at once at every site, naming
# the rank, and site-b, which never ran it, lets go of site-a's frames for
# it: site-a has nothing left unacknowledged by the time it stops (checked
# below: a quick stop).
wait_for "$(site_log 0)" "event=step_failed job=victim step=1 .*rank 2 of job 'victim'" 5 ||
	fail "site-a's abandoned step did not fail naming rank 2"
expect "$(site_log 1)" "event=abort_recorded job=victim step=1 .*site site-a.*rank 2 of job 'victim'" \
	"site-b recorded site-a's abort of step 1"

# The gateway still serves, beyond its 32 job slots.
for j in $(seq 1 34); do
	ranks_start "job$j" 1 1 1
	check_ranks
done
log "34 jobs one after another: ok"
run_ok after 1000003 2 2
stop_at=${EPOCHREALTIME/[.,]/}
mesh_stop
stop_ms=$(((${EPOCHREALTIME/[.,]/} - stop_at) / 1000))
# A gateway with frames still unacknowledged waits 2 s for them at stop.
[ "$stop_ms" -lt 1500 ] || fail "the gateways took ${stop_ms} ms to stop: frames were left unacknowledged"
