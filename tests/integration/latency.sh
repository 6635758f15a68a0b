#!/usr/bin/env bash
# WAN latency: 20 ms one way on every link between three sites (a 40 ms
# round trip). Steps complete with identical results at every site, for
# both algorithms, and take at least the link's latency, which shows the
# traffic really crossed the emulated links: nothing depends on loopback
# timing.
. "$(dirname "$0")/lib.sh"

K=3
LINK_ARGS=(--delay-ms 20)
for ALGO in direct ring; do
	mesh_start
	mesh_up 15
	run_ok "tiny-$ALGO" 1 2 3
	for name in "${!rank_rc[@]}"; do
		case $name in tiny-$ALGO-*) ;; *) continue ;; esac
		p50=$(sed -n 's/.* step_ms_p50=\([0-9]*\)\..*/\1/p' "$work/$name.out")
		[ "${p50:-0}" -ge 20 ] || fail "$name: a step took ${p50:-?} ms over links with 20 ms one-way delay"
		slowest=$((p50 > ${slowest:-0} ? p50 : ${slowest:-0}))
	done
	log "median step of one element, $ALGO: up to $slowest ms"
	slowest=0
	run_ok "big-$ALGO" 1000003 1 2
	mesh_stop
done
