#!/usr/bin/env bash
# gradgate status against two running gateways: the table and the JSON
# name the site, the peer with its address and streams, a job whose ranks
# are still connected, and a step that failed with its code and message;
# --config finds the socket as --control does. Without a gateway at the
# socket, it says so and exits 3. A control socket removed under a running
# gateway is made again; while its folder is unsafe it is not, and the
# gateway says so once. Out of descriptors, a failed accept is said once a
# second at most.
. "$(dirname "$0")/lib.sh"

# ---- nothing listens
rc=0
"$GRADGATE" status --control "unix:$work/none.sock" >"$work/none.out" 2>&1 || rc=$?
[ "$rc" = 3 ] || fail "status without a gateway exited $rc, expected 3"
expect "$work/none.out" "^gradgate status: no gateway listens on unix:$work/none.sock \(No such file or directory\); is gradgate running" \
	"status without a gateway"
: >"$work/plain-file"
rc=0
"$GRADGATE" status --control "unix:$work/plain-file" >"$work/plain.out" 2>&1 || rc=$?
[ "$rc" = 3 ] || fail "status at a plain file exited $rc, expected 3"
expect "$work/plain.out" "^gradgate status: no gateway listens on unix:$work/plain-file" "status at a plain file"
rc=0
"$GRADGATE" status --config "$work/missing.toml" >"$work/cfg.out" 2>&1 || rc=$?
[ "$rc" = 1 ] || fail "status with a missing config exited $rc, expected 1"
rc=0
"$GRADGATE" status >/dev/null 2>&1 || rc=$?
[ "$rc" = 2 ] || fail "status without --config or --control exited $rc, expected 2"
# One gateway at a time: a second --control would win unseen.
rc=0
"$GRADGATE" status --control "unix:$work/a.sock" --control "unix:$work/b.sock" >"$work/twice.out" 2>&1 || rc=$?
[ "$rc" = 2 ] || fail "status with --control twice exited $rc, expected 2"
expect "$work/twice.out" "^gradgate status: --control is given twice \\('unix:$work/a.sock', then 'unix:$work/b.sock'\\)" \
	"status with --control twice"
rc=0
"$GRADGATE" status --control tcp:127.0.0.1:1 >"$work/tcp.out" 2>&1 || rc=$?
[ "$rc" = 2 ] || fail "status with a tcp: endpoint exited $rc, expected 2"
expect "$work/tcp.out" "a gateway is reached by its unix: control socket, on its own host" "status with a tcp: endpoint"
log "no gateway: $(head -n1 "$work/none.out")"

# ---- two gateways: a job done, a step failed, a job waiting
K=2
LOG_LEVEL=debug # a step_done line for each completed step, none for a failed one
started_at=${EPOCHREALTIME/[.,]/}
mesh_start
mesh_up 15
run_ok done 1000 1 3
for ((i = 0; i < K; i++)); do
	wait_for "$(site_log $i)" 'level=debug event=step_done job=done step=3 tensor=1 elements=1000 algorithm=ring ms=[0-9]' 5 ||
		fail "${SITES[$i]} logged no step_done for step 3 at --log-level debug"
done
# A lone rank whose deadline passes: step 1 fails at site-a (GG_ERR_TIMEOUT).
rank_start lonely 1000 0 1 0 1 --timeout-ms 300
ranks_wait
[ "${rank_rc[lonely-s0-r0]}" != 0 ] || fail "the lonely rank's step did not fail"
expect_none "$(site_log 0)" 'event=step_done job=lonely' "a failed step's step_done line"
# One rank of two: connected, its step waiting for the other.
rank_start waiting 1000 0 2 0 1
wait_for "$(site_log 0)" "rank 0 of job 'waiting' connected" 10 || fail "the waiting rank did not connect"

"$GRADGATE" status --control "unix:$work/site-a.sock" >"$work/status.out" 2>"$work/status.err" ||
	fail "status exited $?: $(cat "$work/status.err")"
cat "$work/status.out"
expect "$work/status.out" "^site site-a  gradgate [0-9.]+  up ([0-9]+ ms|[0-9]+s|[0-9]+m[0-9]+s)  steps completed 3, failed 1$" "the site line"
expect "$work/status.out" "^site-b +127\.0\.0\.1:${gw_port[1]} +2/2 +([0-9.]+|-) +([0-9]+B|[0-9]+\.[0-9][KMGTPE]iB) +([0-9]+B|[0-9]+\.[0-9][KMGTPE]iB) +([0-9]+ ms|[0-9]+s) ago$" \
	"the peer line"
expect "$work/status.out" "^waiting +1/2 +0 +gathering +$(id -u)$" "the waiting job"
expect "$work/status.out" "^RECENT FAILURES \(1 of 1, newest first\)$" "the failures' title"
expect "$work/status.out" "^([0-9]+ ms|[0-9]+s) ago +lonely +1 +GG_ERR_TIMEOUT +.*lonely" "the failure"

# status reads only the config's settings: a key whose mode drifted since
# the gateway started is not its business (it fails the next start).
chmod 644 "$work/certs/site-b.key"
"$GRADGATE" status --config "$work/site-b.toml" --json >"$work/status-b.json" 2>"$work/status.err" ||
	fail "status --config --json exited $?: $(cat "$work/status.err")"
chmod 600 "$work/certs/site-b.key"
"$GRADGATE" status --control "unix:$work/site-a.sock" --json >"$work/status-a.json" 2>"$work/status.err" ||
	fail "status --json exited $?: $(cat "$work/status.err")"
python3 - "$work/status-a.json" "$work/status-b.json" "${gw_port[0]}" "${gw_port[1]}" "$(id -u)" \
	"$((${EPOCHREALTIME/[.,]/} - started_at))" <<'PY' ||
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
port_a, port_b, uid, since_start = sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6]) / 1e6
problems = []
# Up since their start, which came after started_at, exactly (not rounded
# as the table's "up 489 ms" is); a failure is no older than its gateway.
for me in (a, b):
    up = me["uptime_s"]
    if not (isinstance(up, (int, float)) and 0 < up < since_start):
        problems.append(f"{me['site']} uptime_s {up!r}, expected between 0 and {since_start:.3f}")
    for f in me["failures"]:
        if not (0 <= f["age_s"] <= me["uptime_s"]):
            problems.append(f"{me['site']} failure age_s {f['age_s']!r} with uptime_s {me['uptime_s']!r}")
def want(what, got, expected):
    if got != expected:
        problems.append(f"{what}: {got!r}, expected {expected!r}")
want("a.site", a["site"], "site-a")
want("b.site", b["site"], "site-b")
want("a.steps_completed", a["steps_completed"], 3)
want("b.steps_completed", b["steps_completed"], 3)
want("a.steps_failed", a["steps_failed"], 1)
want("b.steps_failed", b["steps_failed"], 0)
for me, peer, port in ((a, "site-b", port_b), (b, "site-a", port_a)):
    want(f"{me['site']} peers", [p["site"] for p in me["peers"]], [peer])
    p = me["peers"][0]
    want(f"{me['site']} peer address", p["address"], f"127.0.0.1:{port}")
    want(f"{me['site']} streams", (p["streams_up"], p["streams"]), (2, 2))
    if not (p["bytes_in"] > 0 and p["bytes_out"] > 0 and p["last_heard_s"] is not None and p["last_heard_s"] < 5):
        problems.append(f"{me['site']} peer figures: {p}")
    if not (p["rtt_ms"] is None or p["rtt_ms"] > 0):
        problems.append(f"{me['site']} rtt_ms: {p['rtt_ms']}")
want("a.jobs", [(j["name"], j["ranks"], j["connected"], j["last_step"], j["state"], j["uid"]) for j in a["jobs"]],
     [("waiting", 2, 1, 0, "gathering", uid)])
want("a.jobs_total", a["jobs_total"], 1)
want("b.jobs", b["jobs"], [])
want("a.failures", [(f["job"], f["step"], f["code"]) for f in a["failures"]], [("lonely", 1, "GG_ERR_TIMEOUT")])
if a["failures"] and "lonely" not in a["failures"][0]["message"]:
    problems.append(f"the failure's message does not name its job: {a['failures'][0]['message']}")
want("b.failures", b["failures"], [])
print("\n".join(problems))
sys.exit(1 if problems else 0)
PY
	fail "the JSON status is not what the gateways hold"
log "status: $(head -n1 "$work/status.out"); JSON of both sites checked"

# A job that failed while a rank of it stays connected: its last step is
# the last that ended, failed ones too (a rank left after step 1, so
# steps 2 and 3 fail at once at the rank that goes on).
rank_start broke 1000 0 3 0 3 --late 1000@2
rank_start broke 1000 1 3 0 1
rank_start broke 1000 2 3 0 2 --late 30000@2
rank_start broke 1000 0 1 1 1
wait_for "$work/broke-s0-r0.err" "step 3: error" 15 || fail "steps 2 and 3 of job 'broke' did not fail at site-a"
"$GRADGATE" status --control "unix:$work/site-a.sock" --json >"$work/broke.json" 2>"$work/status.err" ||
	fail "status --json exited $?: $(cat "$work/status.err")"
python3 -c '
import json, sys
j = [j for j in json.load(open(sys.argv[1]))["jobs"] if j["name"] == "broke"]
sys.exit(not (len(j) == 1 and (j[0]["connected"], j[0]["last_step"], j[0]["state"]) == (1, 3, "failed")))' \
	"$work/broke.json" || fail "the failed job in the status: $(cat "$work/broke.json")"

# ---- a gateway whose peer never came up: heard from never, not since
# the gateway's start
mesh_stop
ranks_wait
gw_start 0 || fail "site-a could not start alone"
sleep 1.2
"$GRADGATE" status --control "unix:$work/site-a.sock" >"$work/lone.out" 2>&1 || fail "status of a lone gateway failed"
expect "$work/lone.out" "^site-b +127\.0\.0\.1:${gw_port[1]} +0/2 .* never$" "the peer never heard from"
"$GRADGATE" status --control "unix:$work/site-a.sock" --json >"$work/lone.json" 2>&1 ||
	fail "status --json of a lone gateway failed"
python3 -c 'import json, sys; p = json.load(open(sys.argv[1]))["peers"][0]; sys.exit(p["last_heard_s"] is not None)' \
	"$work/lone.json" || fail "a peer never heard from has last_heard_s $(cat "$work/lone.json")"
log "lone gateway: $(grep '^site-b' "$work/lone.out")"

# ---- the control socket removed under a running gateway: made again
# within a second or two, it answers status again
rm "$work/site-a.sock"
wait_for "$(site_log 0)" "level=info event=control msg=\"control socket $work/site-a\\.sock was removed while the gateway ran: made again" 10 ||
	fail "site-a did not make its removed control socket again"
"$GRADGATE" status --control "unix:$work/site-a.sock" >"$work/again.out" 2>&1 ||
	fail "status after the socket was made again: $(cat "$work/again.out")"
expect "$work/again.out" "^site-b +127\\.0\\.0\\.1:${gw_port[1]} " "status after the socket was made again"
log "the removed control socket: $(grep -m1 -o 'control socket [^"]*made again' "$(site_log 0)")"
# A file put in its place (renamed over it) is left to its owner, and said
# once.
: >"$work/other-file"
mv "$work/other-file" "$work/site-a.sock"
wait_for "$(site_log 0)" "level=warn event=control msg=\"control socket $work/site-a\\.sock: another file took its path" 10 ||
	fail "site-a did not say another file took its socket's path"
sleep 1.2
[ "$(grep -c 'another file took its path' "$(site_log 0)")" = 1 ] || fail "site-a said more than once that its path was taken"
[ -f "$work/site-a.sock" ] || fail "site-a replaced the file that took its socket's path"
# Removed while its folder is one that others may write to: not made again
# there, said once; made again once the folder is safe.
chmod 0777 "$work" # first: the path is still taken, and not looked at
rm "$work/site-a.sock"
wait_for "$(site_log 0)" "level=warn event=control msg=\"control socket $work/site-a\\.sock was removed, and cannot be made again \\(control socket $work/site-a\\.sock: .*\\): ranks cannot connect until it is \\(tried each second\\)" 10 ||
	{ chmod 0700 "$work"; fail "site-a did not say its control socket cannot be made again in a folder others may write to"; }
sleep 2.2
# Checked before the folder is safe again, when the gateway may remake it.
said=$(grep -c 'cannot be made again' "$(site_log 0)")
[ -e "$work/site-a.sock" ] && { chmod 0700 "$work"; fail "site-a made its control socket again in a folder others may write to"; }
chmod 0700 "$work"
[ "$said" = 1 ] || fail "site-a said $said times that its socket cannot be made again, not once"
log "the socket in an unsafe folder: $(grep -m1 -o 'control socket [^"]*cannot be made again[^"]*' "$(site_log 0)")"
for ((i = 0; i < 500; i++)); do
	[ "$(grep -c 'was removed while the gateway ran: made again' "$(site_log 0)")" = 2 ] && break
	sleep 0.02
done
[ "$i" -lt 500 ] || fail "site-a did not make its control socket again once its folder was safe"
gw_stop 0

# ---- out of descriptors: a failed accept is said once a second at most,
# and the connections that wait are taken once descriptors are back. The
# gateway runs with 40 descriptors; connections that send nothing hold
# them (max_clients served and as many waiting: 32 here). (An accept in
# flight keeps the limit it was queued under: the limit is set before the
# gateway starts.)
if command -v prlimit >/dev/null; then
	real=$GRADGATE
	cat >"$work/fd40" <<EOT
#!/bin/sh
exec prlimit --nofile=40:40 -- "$real" "\$@"
EOT
	chmod +x "$work/fd40"
	GRADGATE=$work/fd40
	gw_start 0 || fail "site-a did not start with 40 descriptors"
	GRADGATE=$real
	# A hard limit below what the config may hold: said at start, with both
	# figures, and the gateway goes on.
	expect "$(site_log 0)" 'level=warn event=file_limit site=site-a limit=40 need=[0-9]+ reason="the open file limit is below what 1 peers x [0-9]+ streams and 16 clients may hold"' \
		"site-a's log with a hard file limit of 40"
	open_fds=$(ls "/proc/${gw_pid[0]}/fd" | wc -l)
	[ "$open_fds" -lt 32 ] || fail "site-a holds $open_fds descriptors at start: too many to fill the rest"
	start=${EPOCHREALTIME/[.,]/}
	python3 -c '
import socket, sys, time
held = []
for _ in range(100):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(sys.argv[1])
    held.append(s)
time.sleep(3)' "$work/site-a.sock" || fail "cannot hold 100 connections to site-a's control socket"
	lines=$(since_start "$(site_log 0)" | grep -c 'sock: accept: Too many open files')
	spent=$(((${EPOCHREALTIME/[.,]/} - start) / 1000))
	"$GRADGATE" status --control "unix:$work/site-a.sock" >"$work/nofd.out" 2>&1 ||
		fail "status once descriptors were back: $(cat "$work/nofd.out")"
	log "out of descriptors ($open_fds of 40 taken at start, 100 connections held): $lines accept lines in $spent ms, then status answered"
	[ "$lines" -ge 1 ] && [ "$lines" -le $((spent / 1000 + 1)) ] || fail "$lines lines of failed accepts in $spent ms"
	expect "$(site_log 0)" "level=warn event=control msg=\"control socket $work/site-a\\.sock: accept: Too many open files\"" \
		"the failed accept, at warn level, naming the socket and the cause"
	gw_stop 0
	# A soft limit below that and a hard one above (this shell's): raised
	# to what it needs, with nothing to say.
	need=$(grep -o 'event=file_limit site=site-a limit=40 need=[0-9]*' "$(site_log 0)" | head -1)
	need=${need##*need=}
	hard=$(ulimit -Hn)
	if [ "$hard" = unlimited ] || [ "$hard" -ge "$need" ]; then
		cat >"$work/fd40" <<EOT
#!/bin/sh
exec prlimit --nofile=40:$hard -- "$real" "\$@"
EOT
		GRADGATE=$work/fd40
		gw_start 0 || fail "site-a did not start with a soft file limit of 40"
		GRADGATE=$real
		soft=$(awk '/^Max open files/ {print $4}' "/proc/${gw_pid[0]}/limits")
		[ "$soft" = "$need" ] || fail "site-a's soft file limit is $soft, want $need (the need it logged at 40)"
		n=$(since_start "$(site_log 0)" | grep -c 'event=file_limit' || true)
		[ "$n" = 0 ] || fail "site-a logged file_limit with the hard limit at $hard"
		log "file limit: a hard limit of 40 logged file_limit (need $need); a soft one was raised to $soft"
		gw_stop 0
	else
		log "this shell's hard file limit $hard is below $need: raising the soft limit not checked"
	fi
else
	log "prlimit is not installed: failed accepts not checked"
fi

# ---- a gateway that stopped: no answer, exit 3
rc=0
"$GRADGATE" status --control "unix:$work/site-a.sock" >"$work/gone.out" 2>&1 || rc=$?
[ "$rc" = 3 ] || fail "status of a stopped gateway exited $rc, expected 3"
expect "$work/gone.out" "no gateway listens on unix:$work/site-a.sock" "status of a stopped gateway"
