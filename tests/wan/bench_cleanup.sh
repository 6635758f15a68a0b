#!/usr/bin/env bash
# The benchmark tools leave nothing behind when a run is cut short:
# `gradgate-bench gateway` stopped (SIGTERM) removes its throwaway
# certificates and keys, and dies of the signal; bench/loopback.sh whose rank fails
# stops at once, with no gateway left running and no folder left.
#
#   bench_cleanup.sh SRC BUILD
set -euo pipefail

src=${1:?usage: bench_cleanup.sh SRC BUILD}
build=${2:?usage: bench_cleanup.sh SRC BUILD}
work=$(mktemp -d "${TMPDIR:-/tmp}/gg-bench-cleanup.XXXXXX")
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
	pkill -KILL -f "$work/" 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# gateway: stopped once its keys exist. (SIGTERM: a background job of a
# script starts with SIGINT ignored, and the bench leaves it so.)
mkdir "$work/tmp"
TMPDIR=$work/tmp "$build/bench/gradgate-bench" gateway --count 1048576 --steps 10000 --baseline-time 0 \
	>/dev/null 2>"$work/gateway.err" &
pids+=("$!")
for ((i = 0; i < 200; i++)); do
	! compgen -G "$work/tmp/*/s1.key" >/dev/null || break
	kill -0 "${pids[0]}" 2>/dev/null || fail "gradgate-bench gateway ended: $(cat "$work/gateway.err")"
	sleep 0.05
done
compgen -G "$work/tmp/*/s1.key" >/dev/null || fail "gradgate-bench gateway made no keys in TMPDIR within 10 s"
sleep 0.3
kill -TERM "${pids[0]}"
rc=0
wait "${pids[0]}" || rc=$?
[ "$rc" = 143 ] || fail "gradgate-bench gateway exited $rc after SIGTERM, not 143: $(cat "$work/gateway.err")"
[ -z "$(ls -A "$work/tmp")" ] || fail "gradgate-bench gateway left $(ls -A "$work"/tmp/*) behind"
echo "gateway: SIGTERM exits 143 and leaves no certificates or keys"

# gateway: a TMPDIR too long for its folder is refused, naming it.
rc=0
TMPDIR=/$(printf 'x%.0s' {1..300}) "$build/bench/gradgate-bench" gateway --steps 1 >/dev/null 2>"$work/long.err" || rc=$?
[ "$rc" = 1 ] && grep -q "TMPDIR is 301 bytes long" "$work/long.err" ||
	fail "a 301-byte TMPDIR: exit $rc, $(cat "$work/long.err")"

# loopback.sh: a build folder whose rank fails.
mkdir -p "$work/build/gateway" "$work/build/bench"
ln -s "$(cd "$build" && pwd)/gateway/gradgate" "$work/build/gateway/gradgate"
cat >"$work/build/bench/gradgate-bench" <<EOS
#!/usr/bin/env bash
[ "\$1" = allreduce ] && { echo "a rank that fails" >&2; exit 1; }
exec "$(cd "$build" && pwd)/bench/gradgate-bench" "\$@"
EOS
chmod +x "$work/build/bench/gradgate-bench"
mkdir "$work/tmp2"
rc=0
TMPDIR=$work/tmp2 timeout 60 "$src/bench/loopback.sh" --build "$work/build" --runs 1 --count 4096 --steps 2 \
	>"$work/loopback.out" 2>"$work/loopback.err" || rc=$?
[ "$rc" = 2 ] || fail "loopback.sh exited $rc with a failing rank, not 2 (124: it hung): $(cat "$work/loopback.err")"
grep -q "loopback.sh: rank 0 failed" "$work/loopback.err" || fail "loopback.sh said: $(cat "$work/loopback.err")"
! pgrep -f "$work/tmp2/" >/dev/null || fail "loopback.sh left $(pgrep -af "$work/tmp2/")"
[ -z "$(ls -A "$work/tmp2")" ] || fail "loopback.sh left $(ls -A "$work/tmp2")"
echo "loopback.sh: a failing rank stops the run at once (exit 2), nothing left running or behind"

# wan --cleanup: removes the folders its own runs left, and no other: not
# one that another user owns (it could swap a folder in it for a link to
# anything while root removes it), nor one that others may enter.
t3=$work/tmp3 p=ggc$$
mkdir "$t3" "$t3/gradgate-wan-$p.own" "$t3/gradgate-wan-$p.open" "$t3/gradgate-wan-$p.other"
chmod 700 "$t3/gradgate-wan-$p.own" "$t3/gradgate-wan-$p.other"
chmod 755 "$t3/gradgate-wan-$p.open"
mkdir "$t3/gradgate-wan-$p.own/d" && touch "$t3/gradgate-wan-$p.own/d/f"
owner=$(id -u)
if [ "$owner" = 0 ]; then chown 4242 "$t3/gradgate-wan-$p.other"; owner=4242; fi
TMPDIR=$t3 "$build/bench/gradgate-bench" wan --cleanup --prefix "$p" >"$work/wan-cleanup.out" 2>&1 ||
	fail "wan --cleanup failed: $(cat "$work/wan-cleanup.out")"
[ ! -e "$t3/gradgate-wan-$p.own" ] || fail "wan --cleanup left its own run's folder: $(cat "$work/wan-cleanup.out")"
grep -q "^left $t3/gradgate-wan-$p.open alone: not a folder of this user's" "$work/wan-cleanup.out" &&
	[ -d "$t3/gradgate-wan-$p.open" ] || fail "wan --cleanup on a folder others may enter: $(cat "$work/wan-cleanup.out")"
if [ "$owner" = 4242 ]; then
	grep -q "^left $t3/gradgate-wan-$p.other alone" "$work/wan-cleanup.out" && [ -d "$t3/gradgate-wan-$p.other" ] ||
		fail "wan --cleanup on another user's folder: $(cat "$work/wan-cleanup.out")"
fi
echo "wan --cleanup: removes its own runs' folders, leaves those of other users or open to them"
