# Shared set-up of the process-level integration tests: real gradgate
# daemons on loopback, ranks as gradgate-bench allreduce processes, and
# linkem between sites where a test wants a WAN link. Sourced by each test;
# meson passes the programs in GRADGATE, BENCH, LINKEM and MAKE_CERTS, and
# the Python interpreter in PYTHON (python3 below).
#
# Everything a test starts is a direct child that stays in the test's
# process group, so meson's kill of that group on a timeout reaches it too;
# each is listed in `pids` until reaped, and the EXIT trap stops and reaps
# what is left, runs the commands a test added to `at_exit` (a namespace
# to delete) and removes the temporary folder (GG_INTEG_KEEP=1 keeps it,
# GG_INTEG_QUIET=1 leaves out the logs on failure). A test sets no EXIT
# trap of its own: under set -e a failing command in one ends it before
# the processes are stopped. Waits poll with a
# deadline; nothing sleeps for a fixed time and hopes. The loops that poll
# start as few processes as they can (a fork costs milliseconds on a small
# virtual machine, and they poll every 20 ms): clocks come from bash's
# EPOCHREALTIME, whose digits without the point are microseconds, and
# sleep is a read that times out.
set -euo pipefail

: "${GRADGATE:?}" "${BENCH:?}" "${LINKEM:?}" "${MAKE_CERTS:?}"
for prog in "$GRADGATE" "$BENCH" "$LINKEM" "$MAKE_CERTS"; do
	[ -x "$prog" ] || { echo "not executable: $prog" >&2; exit 1; }
done

SITES=(site-a site-b site-c site-d) # index order = sorted name order
work=$(mktemp -d "${TMPDIR:-/tmp}/gg-integ.XXXXXX")
pids=()
at_exit=()
test_name=$(basename "$0" .sh)
# sleep SECONDS without a process: a read that times out on a pipe nobody
# writes to (this shell holds its only write end).
exec {nap_fd}<> <(:)
sleep() { read -r -t "$1" -u "$nap_fd" _ || true; }
# python3 is PYTHON where meson passes it: first on PATH, as a link (a
# function would put a shell between a test and the python3 it starts).
if [ -n "${PYTHON:-}" ]; then
	mkdir "$work/bin"
	ln -s "$PYTHON" "$work/bin/python3"
	PATH=$work/bin:$PATH
fi
t_start=${EPOCHREALTIME/[.,]/}

# Settings of the next mesh; tests change them before mesh_start.
K=2
CODEC=fp32
SCALE=fp32
ALGO=ring
STEP_TIMEOUT=10s
HEARTBEAT_TIMEOUT=5s
HEARTBEAT_INTERVAL=500ms
RECONNECT_MIN=20ms
RECONNECT_MAX=200ms
MEMORY=2GiB
STREAMS=2
CHUNK=256KiB
SOCKET_BUFFER=1MiB
THREADS=2                 # lanes per gateway: 2 threads, each with a loop and a share of the streams
LINK_ARGS=()              # linkem options for every dialer -> acceptor link; () = no links
METRICS=0                 # 1: every gateway serves /metrics on a port of its own (metrics_port[I])
TRANSPORT_EXTRA=          # more lines for every gateway's [transport] table
LOG_LEVEL=                # the gateways' --log-level; empty: their default (info)
declare -A SITE_CODEC=() SITE_SCALE=() SITE_ALGO=() # per-site overrides (a refused mesh)
declare -A SITE_THREADS=()
declare -A LINK_EXTRA=()  # "i-j": extra linkem options for that link
declare -A DIAL=()        # "i-j": site i's [[peers]] dial for site j (unset: out/in across a link, else both)
declare -A PEER_ADDR=()   # "i-j": the address site i dials site j on (unset: j's listen address or link; @PORT@: j's port; none: no address)

declare -a gw_pid gw_port metrics_port
declare -A link_pid link_addr # "IJ": the link from site I to site J

log() { printf '[%s +%ss] %s\n' "$test_name" "$(elapsed)" "$*"; }
elapsed() { local ms=$(((${EPOCHREALTIME/[.,]/} - t_start) / 1000)); printf '%d.%03d' $((ms / 1000)) $((ms % 1000)); }

dump_logs() {
	local f
	for f in "$work"/*.log "$work"/*.err "$work"/*.out; do
		[ -s "$f" ] || continue
		echo "----- $(basename "$f") (last 40 lines)"
		tail -n 40 "$f"
	done
}

# fail MESSAGE: ends the test; the EXIT trap shows the logs and cleans up.
fail() {
	echo "FAIL: $*" >&2
	exit 1
}

# True while PID runs (a zombie, exited but not reaped, does not count).
alive() {
	local stat
	{ read -r stat <"/proc/$1/stat"; } 2>/dev/null || return 1
	stat=${stat##*) }
	[ "${stat:0:1}" != Z ]
}

# wait_exit PID SECONDS: waits for PID to exit; false when it still runs.
wait_exit() {
	local pid=$1 deadline=$((${EPOCHREALTIME/[.,]/} + $2 * 1000000))
	while alive "$pid"; do
		[ "${EPOCHREALTIME/[.,]/}" -lt "$deadline" ] || return 1
		sleep 0.02
	done
}

# reap PID: sets reaped to its exit status (not in a subshell: only this
# shell can wait for its children).
reaped=0
reap() {
	reaped=0
	wait "$1" 2>/dev/null || reaped=$?
	forget "$1"
}

# forget PID: off the cleanup list once reaped (its number may be reused).
forget() {
	local i
	for i in "${!pids[@]}"; do
		[ "${pids[$i]}" != "$1" ] || unset "pids[$i]"
	done
}

# stop_pid PID SIGNAL: signal, wait up to 10 s, then SIGKILL; reaps it.
stop_pid() {
	local pid=$1 sig=${2:-TERM}
	[ -n "$pid" ] || return 0
	kill "-$sig" "$pid" 2>/dev/null || true
	if ! wait_exit "$pid" 10; then
		echo "pid $pid ignored SIG$sig for 10 s; killing it" >&2
		kill -KILL "$pid" 2>/dev/null || true
	fi
	reap "$pid"
}

# On a signal (meson's timeout: SIGKILL follows within half a second)
# there is no time to let gateways drain: they are killed at once.
aborted=
cleanup() {
	local rc=$? sig=TERM
	trap - EXIT
	set +e
	[ -z "$aborted" ] || sig=KILL
	for pid in "${pids[@]}"; do
		kill "-$sig" "$pid" 2>/dev/null
	done
	for pid in "${pids[@]}"; do
		if ! wait_exit "$pid" 10; then
			kill -KILL "$pid" 2>/dev/null
		fi
		wait "$pid" 2>/dev/null
	done
	for cmd in "${at_exit[@]}"; do
		eval "$cmd"
	done
	# A sanitizer report in any process's log fails the test, even one
	# whose process carried on (ASan leaks at exit, TSan without halting).
	if grep -lE "ERROR: (Address|Leak)Sanitizer|WARNING: ThreadSanitizer|runtime error:" "$work"/*.log \
		>/dev/null 2>&1; then
		echo "FAIL: sanitizer report in $(grep -lE "Sanitizer|runtime error:" "$work"/*.log | xargs -n1 basename)" >&2
		[ "$rc" != 0 ] || rc=1
	fi
	if [ "$rc" != 0 ] && [ -z "${GG_INTEG_QUIET:-}" ]; then
		dump_logs >&2
	fi
	if [ -n "${GG_INTEG_KEEP:-}" ]; then
		echo "kept $work" >&2
	else
		rm -rf "$work"
	fi
	log "exit $rc"
	exit "$rc"
}
trap cleanup EXIT
trap 'aborted=1; exit 143' TERM INT HUP

# wait_for FILE REGEX SECONDS: polls until a line of FILE matches.
wait_for() {
	local file=$1 re=$2 deadline=$((${EPOCHREALTIME/[.,]/} + $3 * 1000000))
	until grep -Eq -- "$re" "$file" 2>/dev/null; do
		[ "${EPOCHREALTIME/[.,]/}" -lt "$deadline" ] || return 1
		sleep 0.02
	done
}

# wait_job S JOB REGEX WHAT: waits up to 10 s until `gradgate status` of site
# S lists JOB with the rest of its line (ranks connected/all, last step,
# state) matching REGEX; fails the test, saying JOB never WHAT, otherwise.
wait_job() {
	local i sock="unix:$work/${SITES[$1]}.sock"
	for ((i = 0; i < 200; i++)); do
		"$GRADGATE" status --control "$sock" 2>/dev/null | grep -Eq "^$2 +$3" && return 0
		sleep 0.05
	done
	fail "job $2 never $4 at ${SITES[$1]}: $("$GRADGATE" status --control "$sock" 2>&1)"
}

# wait_streams S P UP SECONDS WHAT: waits until `gradgate status` of site S
# shows UP streams up to site P; fails the test, saying P was never WHAT.
wait_streams() {
	local sock="unix:$work/${SITES[$1]}.sock" deadline=$((${EPOCHREALTIME/[.,]/} + $4 * 1000000))
	until "$GRADGATE" status --control "$sock" 2>/dev/null | grep -Eq "^${SITES[$2]} +[^ ]+ +$3/"; do
		[ "${EPOCHREALTIME/[.,]/}" -lt "$deadline" ] ||
			fail "${SITES[$1]} did not see ${SITES[$2]} $5 within $4 s: $("$GRADGATE" status --control "$sock" 2>&1)"
		sleep 0.05
	done
}

# wait_running S JOB: until site S's gateway runs a step of JOB (every rank
# there announced it and the step reached the core).
wait_running() { wait_job "$1" "$2" ".* running " ran; }

# expect FILE REGEX WHAT: FILE has a line matching REGEX, or the test fails.
expect() {
	grep -Eq -- "$2" "$1" 2>/dev/null || fail "$3: no line of $(basename "$1") matches /$2/"
}

# expect_none FILE REGEX WHAT: no line of FILE matches REGEX.
expect_none() {
	if grep -Eq -- "$2" "$1" 2>/dev/null; then
		fail "$3: unexpected line in $(basename "$1"): $(grep -E -m1 -- "$2" "$1")"
	fi
}

# free_ports N: N TCP ports that are free on 127.0.0.1 now, all held
# together, so they differ. Picked outside the range the system hands out
# for port 0 and for connections' source ports: a gateway that restarts
# must listen on its port again, which any connection made while it was
# down could take if it lay in that range. (The system's own pick where
# that range leaves no room.)
free_ports() {
	python3 - "$1" <<'PY'
import random, socket, sys
n = int(sys.argv[1])
with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
    lo, hi = map(int, f.read().split())
spans = [(a, b) for a, b in ((10000, lo), (hi + 1, 65536)) if b - a >= 64]
socks, taken = [], set()
for _ in range(100 * n):
    if len(socks) == n or not spans:
        break
    a, b = random.choice(spans)
    port = random.randrange(a, b)
    s = socket.socket()
    try:
        if port not in taken:
            s.bind(("127.0.0.1", port))
            socks.append(s)
            taken.add(port)
            continue
    except OSError:
        pass
    s.close()
while len(socks) < n:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
}

make_certs() {
	[ -f "$work/certs/ca.pem" ] && return 0
	"$MAKE_CERTS" --out "$work/certs" "${SITES[@]:0:4}" >/dev/null
}

# link_start I J TARGET_PORT: linkem from site I (the dialer) to site J.
link_start() {
	local i=$1 j=$2 port=$3 out="$work/link-$1-$2.out"
	local extra=${LINK_EXTRA["$i-$j"]:-}
	# The shell truncates the file only once the child runs: a file left
	# by an earlier mesh would otherwise give its address.
	rm -f "$out"
	# shellcheck disable=SC2086
	"$LINKEM" --listen 127.0.0.1:0 --target "127.0.0.1:$port" "${LINK_ARGS[@]}" $extra \
		>"$out" 2>"$work/link-$i-$j.log" &
	link_pid[$i$j]=$!
	pids+=("$!")
	wait_for "$out" '^listening on ' 10 || fail "linkem $i-$j did not start"
	link_addr[$i$j]=$(sed -n 's/^listening on //p' "$out")
}

# write_config I: site I's configuration, for the current settings.
write_config() {
	local i=$1 name=${SITES[$1]} f="$work/${SITES[$1]}.toml" dial
	local codec=${SITE_CODEC[$i]:-$CODEC} scale=${SITE_SCALE[$i]:-$SCALE} algo=${SITE_ALGO[$i]:-$ALGO}
	{
		cat <<EOF
[site]
name = "$name"
listen = "127.0.0.1:${gw_port[$i]}"
control = "unix:$work/$name.sock"
threads = ${SITE_THREADS[$i]:-$THREADS}

[tls]
ca = "certs/ca.pem"
cert = "certs/$name.pem"
key = "certs/$name.key"

EOF
		local j addr
		for ((j = 0; j < K; j++)); do
			[ "$j" != "$i" ] || continue
			addr="127.0.0.1:${gw_port[$j]}"
			if [ "$i" -lt "$j" ] && [ -n "${link_addr[$i$j]:-}" ]; then
				addr=${link_addr[$i$j]}
			fi
			addr=${PEER_ADDR["$i-$j"]:-$addr}
			addr=${addr//@PORT@/${gw_port[$j]}}
			printf '[[peers]]\nsite = "%s"\nidentity = "dns:%s.gradgate.test"\n' "${SITES[$j]}" "${SITES[$j]}"
			[ "$addr" = none ] || printf 'address = "%s"\n' "$addr"
			dial=${DIAL["$i-$j"]:-}
			if [ -z "$dial" ] && [ -n "${link_addr[$((i < j ? i : j))$((i < j ? j : i))]:-}" ]; then
				# Joined by a link: the first site dials through it and the
				# other only takes its streams, so every stream crosses it.
				dial=$([ "$i" -lt "$j" ] && echo out || echo in)
			fi
			[ -z "$dial" ] || printf 'dial = "%s"\n' "$dial"
			echo
		done
		cat <<EOF
[transport]
streams_per_peer = $STREAMS
chunk_size = "$CHUNK"
socket_buffer = "$SOCKET_BUFFER"
heartbeat_interval = "$HEARTBEAT_INTERVAL"
heartbeat_timeout = "$HEARTBEAT_TIMEOUT"
connect_timeout = "2s"
handshake_timeout = "2s"
step_timeout = "$STEP_TIMEOUT"
reconnect_min = "$RECONNECT_MIN"
reconnect_max = "$RECONNECT_MAX"
$TRANSPORT_EXTRA

[compression]
codec = "$codec"
scale = "$scale"

[allreduce]
algorithm = "$algo"

[limits]
memory = "$MEMORY"
max_message = "1GiB"
inflight_per_peer = "8MiB"
max_clients = 16
EOF
		if [ "$METRICS" = 1 ]; then
			printf '\n[metrics]\nlisten = "127.0.0.1:%s"\n' "${metrics_port[$i]}"
		fi
	} >"$f"
	chmod 600 "$f" # whatever the umask: a gateway refuses a config others may write
}

# gw_start I: starts site I's gateway and waits for its 'started' line.
# Returns 1 (without failing the test) when its listening port was taken
# meanwhile, so mesh_start can pick other ports.
gw_start() {
	gw_launch "$1"
	gw_started "$1"
}

# gw_launch I: starts site I's gateway without waiting for it.
declare -a gw_from # the line of site I's log where its current run starts
gw_launch() {
	local i=$1 name=${SITES[$1]}
	local logf="$work/gw-$name.log"
	echo "=== start $(date +%T.%N)" >>"$logf"
	gw_from[$i]=$(grep -c '' "$logf")
	"$GRADGATE" --config "$work/$name.toml" ${LOG_LEVEL:+--log-level "$LOG_LEVEL"} 2>>"$logf" &
	gw_pid[$i]=$!
	pids+=("$!")
}

# gw_started I: waits for the 'started' line of site I's current run, as
# gw_start.
gw_started() {
	local i=$1 name=${SITES[$1]}
	local logf="$work/gw-$name.log" from=${gw_from[$1]}
	local deadline=$((${EPOCHREALTIME/[.,]/} + 10000000))
	until awk -v from="$from" 'NR >= from && index($0, "event=started") { f = 1; exit } END { exit !f }' \
		"$logf"; do
		if ! alive "${gw_pid[$i]}"; then
			reap "${gw_pid[$i]}"
			gw_pid[$i]=
			if grep -q 'cannot listen' <<<"$(tail -n +"$from" "$logf")"; then
				log "gateway $name cannot listen on port ${gw_port[$i]}: $(grep -m1 'cannot listen' <<<"$(tail -n +"$from" "$logf")")"
				return 1
			fi
			fail "gateway $name exited with status $reaped at start"
		fi
		[ "${EPOCHREALTIME/[.,]/}" -lt "$deadline" ] || fail "gateway $name did not start within 10 s"
		sleep 0.02
	done
}

# gw_stop I [SIGNAL]: stops site I's gateway; sets reaped to its status.
gw_stop() {
	gw_signal "$@"
	gw_reap "$1" "${2:-TERM}"
}

# gw_signal I [SIGNAL]: signals site I's gateway (default SIGTERM), which
# gw_reap then waits for.
gw_signal() {
	kill "-${2:-TERM}" "${gw_pid[$1]}" 2>/dev/null || true
}

# gw_reap I [SIGNAL]: waits for site I's gateway to exit after gw_signal;
# sets reaped to its status.
gw_reap() {
	local i=$1 pid=${gw_pid[$1]}
	gw_pid[$i]=
	wait_exit "$pid" 15 || fail "gateway ${SITES[$i]} still runs 15 s after SIG${2:-TERM}"
	reap "$pid"
}

# mesh_up SECONDS: waits until every gateway logged mesh_up since its start.
mesh_up() {
	local i
	for ((i = 0; i < K; i++)); do
		wait_for_since "$work/gw-${SITES[$i]}.log" 'event=mesh_up' "$1" ||
			fail "gateway ${SITES[$i]} did not connect to every peer within $1 s"
	done
}

# since_start FILE: the lines of a gateway log after its last "=== start"
# marker (the current run of a restarted gateway).
since_start() {
	sed -n '/^=== start/h; /^=== start/!H; ${x;p}' "$1" 2>/dev/null
}

# wait_for_since FILE REGEX SECONDS: like wait_for, within since_start.
wait_for_since() {
	local file=$1 re=$2 deadline=$((${EPOCHREALTIME/[.,]/} + $3 * 1000000))
	# No pipe into grep -q: under pipefail, sed's SIGPIPE would read as
	# no match.
	until grep -Eq -- "$re" <<<"$(since_start "$file")"; do
		[ "${EPOCHREALTIME/[.,]/}" -lt "$deadline" ] || return 1
		sleep 0.02
	done
}

# mesh_start: picks ports, starts the links (LINK_ARGS non-empty) and the
# K gateways, and waits until they connected to each other.
mesh_start() {
	make_certs
	local attempt i j k ports
	for attempt in 1 2 3; do
		read -r -a ports <<<"$(free_ports $((2 * K)))"
		for ((i = 0; i < K; i++)); do
			gw_port[$i]=${ports[$i]}
			metrics_port[$i]=${ports[$((K + i))]}
		done
		if [ ${#LINK_ARGS[@]} -gt 0 ]; then
			for ((i = 0; i < K; i++)); do
				for ((j = i + 1; j < K; j++)); do
					link_start "$i" "$j" "${gw_port[$j]}"
				done
			done
			# The ports picked were let go before the links listened: where
			# free_ports fell back on the system's picks, the system may
			# have given one of them to a link.
			local clash=
			for k in "${!link_addr[@]}"; do
				[[ " ${ports[*]} " != *" ${link_addr[$k]##*:} "* ]] || clash=${link_addr[$k]}
			done
			if [ -n "$clash" ]; then
				log "a link got port ${clash##*:}, picked for a gateway; trying other ports"
				mesh_stop
				continue
			fi
		fi
		for ((i = 0; i < K; i++)); do
			write_config "$i"
		done
		# All at once: a mesh forms the same whichever gateway comes first.
		local ok=1
		for ((i = 0; i < K; i++)); do
			gw_launch "$i"
		done
		for ((i = 0; i < K; i++)); do
			gw_started "$i" || ok=0
		done
		[ $ok = 1 ] && return 0
		log "a listening port was taken meanwhile; trying other ports"
		mesh_stop
	done
	fail "could not find free ports for the gateways"
}

# mesh_stop: stops the gateways (each must stop cleanly: status 0 and a
# 'stopped' line) and the links.
mesh_stop() {
	local i k
	for ((i = 0; i < K; i++)); do
		[ -z "${gw_pid[$i]:-}" ] || gw_signal "$i"
	done
	for ((i = 0; i < K; i++)); do
		[ -n "${gw_pid[$i]:-}" ] || continue
		gw_reap "$i"
		[ "$reaped" = 0 ] || fail "gateway ${SITES[$i]} exited $reaped on SIGTERM"
		wait_for_since "$(site_log "$i")" 'event=stopped ' 0 || fail "gateway ${SITES[$i]} logged no 'stopped'"
	done
	for k in "${!link_pid[@]}"; do
		stop_pid "${link_pid[$k]}"
		unset "link_pid[$k]" "link_addr[$k]"
	done
}

# ranks_start JOB COUNT RANKS STEPS [SITE...] [-- EXTRA BENCH ARGS]: starts
# RANKS ranks at each SITE (default: every site), as direct children (so a
# test can signal them), each bounded by ranks_wait.
declare -a rank_pids rank_names
ranks_start() {
	local job=$1 count=$2 ranks=$3 steps=$4
	shift 4
	local sites=() extra=()
	while [ $# -gt 0 ]; do
		if [ "$1" = -- ]; then
			shift
			extra=("$@")
			break
		fi
		sites+=("$1")
		shift
	done
	[ ${#sites[@]} -gt 0 ] || sites=($(seq 0 $((K - 1))))
	local s r
	for s in "${sites[@]}"; do
		for ((r = 0; r < ranks; r++)); do
			rank_start "$job" "$count" "$r" "$ranks" "$s" "$steps" "${extra[@]}"
		done
	done
}

# rank_start JOB COUNT RANK RANKS SITE STEPS [BENCH ARGS]: one rank, named
# JOB-sSITE-rRANK.
rank_start() {
	local job=$1 count=$2 r=$3 ranks=$4 s=$5 steps=$6 name="$1-s$5-r$3"
	shift 6
	"$BENCH" allreduce --endpoint "unix:$work/${SITES[$s]}.sock" --job "$job" \
		--rank "$r" --ranks "$ranks" --site "$s" --sites "$K" --count "$count" \
		--steps "$steps" --codec "$CODEC" "$@" >"$work/$name.out" 2>"$work/$name.err" &
	rank_pids+=("$!")
	rank_names+=("$name")
	pids+=("$!")
}

# ranks_wait: waits for every started rank, at most RANK_LIMIT seconds
# (default 60) in all; sets rank_rc[NAME].
declare -A rank_rc
ranks_wait() {
	local i deadline=$((${EPOCHREALTIME/[.,]/} + ${RANK_LIMIT:-60} * 1000000))
	for i in "${!rank_pids[@]}"; do
		while alive "${rank_pids[$i]}"; do
			if [ "${EPOCHREALTIME/[.,]/}" -ge "$deadline" ]; then
				kill -KILL "${rank_pids[@]}" 2>/dev/null || true
				fail "${rank_names[$i]} still runs after ${RANK_LIMIT:-60} s"
			fi
			sleep 0.02
		done
	done
	for i in "${!rank_pids[@]}"; do
		reap "${rank_pids[$i]}"
		rank_rc[${rank_names[$i]}]=$reaped
	done
	rank_pids=()
	rank_names=()
}

# run_ok JOB COUNT RANKS STEPS [-- BENCH ARGS]: one job at every site; every
# rank must pass its own check, and all must print the same digest.
run_ok() {
	local job=$1 count=$2 ranks=$3 steps=$4 t0
	shift 4
	t0=${EPOCHREALTIME/[.,]/}
	ranks_start "$job" "$count" "$ranks" "$steps" "$@"
	check_ranks
	log "ok: job $job, $K sites x $ranks ranks, $count elements x $steps steps," \
		"$CODEC/$SCALE $ALGO: digest $checked_digest ($((((${EPOCHREALTIME/[.,]/} - t0) / 1000))) ms)"
}

# check_ranks: waits for the ranks started last; each must exit 0 and all
# must print the same digest (left in checked_digest).
checked_digest=
check_ranks() {
	local names=("${rank_names[@]}")
	ranks_wait
	local name digest first=""
	for name in "${names[@]}"; do
		[ "${rank_rc[$name]}" = 0 ] || fail "$name exited ${rank_rc[$name]}: $(cat "$work/$name.err")"
		digest=$(sed -n 's/.* digest=\([0-9a-f]*\)$/\1/p' "$work/$name.out")
		[ -n "$digest" ] || fail "$name printed no digest"
		if [ -z "$first" ]; then
			first=$digest
		elif [ "$digest" != "$first" ]; then
			fail "$name's digest $digest differs from ${names[0]}'s $first"
		fi
	done
	checked_digest=$first
}

# site_log I: the log of site I's gateway (every run of it, each after a
# "=== start" line).
site_log() { echo "$work/gw-${SITES[$1]}.log"; }
