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
# shellcheck source=rank_mesh.sh
. "$(dirname "$0")/rank_mesh.sh"
rank_mesh_init "$TEST_GPU_MODE"
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

	rank_mesh_start "$TEST_GPU_MODE" "$JOB-$CODEC" "${lossy[@]}"
	check_ranks # each exited 0, with the same digest
	for name in "${names[@]}"; do
		log "$name: $(grep -m1 '^time ' "$work/$name.out" || echo 'no time line')"
	done
	log "ok: $CODEC: $K sites x $RANKS ranks, device results equal to host results, digest $checked_digest"
	mesh_stop
done
