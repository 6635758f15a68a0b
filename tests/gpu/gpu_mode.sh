#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# GPU mode end to end: two gateways on loopback and two ranks per site of
# test_gpu_mode, which all-reduce tensors in CUDA device memory
# (gg_allreduce_cuda) and the same inputs in host memory and require the
# same bytes; see test_gpu_mode.c. Twice: with the fp32 codec, and with
# int8 and error feedback (encoded on the gateway's GPU, residuals there,
# against the host path's CPU codec and residuals). Every rank must exit 0 and all must
# print the same digest of their results. Exits 77 (skipped) without a CUDA device, before it
# starts anything. meson passes GRADGATE, BENCH, LINKEM and MAKE_CERTS (as
# to the integration tests) and TEST_GPU_MODE, the rank program.
set -euo pipefail
: "${TEST_GPU_MODE:?}"
[ -x "$TEST_GPU_MODE" ] || { echo "not executable: $TEST_GPU_MODE" >&2; exit 1; }

probe_rc=0
"$TEST_GPU_MODE" --probe || probe_rc=$?
if [ "$probe_rc" = 77 ]; then
	exit 77
elif [ "$probe_rc" != 0 ]; then
	echo "FAIL: $TEST_GPU_MODE --probe exited $probe_rc" >&2
	exit 1
fi

# shellcheck source=../integration/lib.sh
. "$(dirname "$0")/../integration/lib.sh"

K=2
# Headroom for the first device step, in which the gateway starts CUDA and
# opens the ranks' memory; a step normally takes well under a second.
STEP_TIMEOUT=30s
RANK_LIMIT=150
RANKS=2
JOB=gpumode

for CODEC in fp32 int8; do
	lossy=()
	[ "$CODEC" = fp32 ] || lossy=(--lossy)
	mesh_start
	mesh_up 15
	log "$CODEC: mesh up; starting $RANKS ranks at each of $K sites"

	# The ranks, as lib.sh's rank_start starts bench ranks: direct children,
	# output in $work/NAME.out and .err, awaited by ranks_wait within RANK_LIMIT.
	names=()
	rank_pids=()
	rank_names=()
	for ((s = 0; s < K; s++)); do
		for ((r = 0; r < RANKS; r++)); do
			name=$JOB-$CODEC-s$s-r$r
			"$TEST_GPU_MODE" "unix:$work/${SITES[$s]}.sock" "$JOB-$CODEC" "$r" "$RANKS" "$s" "$K" "${lossy[@]}" \
				>"$work/$name.out" 2>"$work/$name.err" &
			rank_pids+=("$!")
			rank_names+=("$name")
			pids+=("$!")
			names+=("$name")
		done
	done
	check_ranks # each exited 0, with the same digest
	for name in "${names[@]}"; do
		log "$name: $(grep -m1 '^time ' "$work/$name.out" || echo 'no time line')"
	done
	log "ok: $CODEC: $K sites x $RANKS ranks, device results equal to host results, digest $checked_digest"
	mesh_stop
done
