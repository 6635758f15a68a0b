# shellcheck shell=bash disable=SC2154 # bench, prefix: the sourcing script's
# What the tests that run gradgate-bench wan share. The script sets
# `bench` (the program) and `prefix` (its namespaces' names) and sources
# this: it gets `tmp` (a folder removed at exit), skip and fail, and
# skips (77) at once without root or where network namespaces cannot be
# made.

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

skip() {
	echo "skipped: $*"
	exit 77
}
fail() {
	echo "FAIL: $*" >&2
	"$bench" wan --cleanup --prefix "$prefix" >&2 || true
	exit 1
}

[ "$(id -u)" = 0 ] || skip "gradgate-bench wan needs root"
PATH=$PATH:/usr/sbin:/sbin
command -v ip >/dev/null || skip "ip (iproute2) is not installed"
ip netns add "${prefix}probe" 2>"$tmp/probe.err" || skip "cannot make a network namespace: $(cat "$tmp/probe.err")"
ip netns delete "${prefix}probe"

# wan_run ARGS...: gradgate-bench wan ARGS --prefix PREFIX --json, its
# rows in $tmp/out and its messages shown. Exit status 3 (the machine
# cannot run it) skips where a kernel part is missing, since the probes
# above passed; any other failure fails.
wan_run() {
	local rc=0
	"$bench" wan "$@" --prefix "$prefix" --json >"$tmp/out" 2>"$tmp/err" || rc=$?
	cat "$tmp/err"
	if [ $rc = 3 ] && grep -Eq 'sch_tbf|CONFIG_BRIDGE|CONFIG_VETH' "$tmp/err"; then
		skip "the kernel lacks a part gradgate-bench wan needs (see above)"
	fi
	[ $rc = 0 ] || fail "gradgate-bench wan exited $rc"
}
