#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# GPU mode with NCCL end to end: two gateways on loopback and two ranks per
# site of test_nccl_mode, which all-reduce CUDA tensors through the NCCL
# communicator each site's ranks form with their gateway
# (gg_allreduce_nccl) and require the exact sum; see test_nccl_mode.c.
#
# NCCL refuses two ranks of one communicator on one GPU of one host, and
# tells hosts apart by NCCL_HOSTID: every rank gets its own, and the
# gateways one of theirs, so that all share the one GPU a test machine may
# have (NCCL then moves the data over its socket transport, on loopback).
# Every rank must exit 0 and all must print the same digest. Exits 77
# (skipped) without a CUDA device, before it starts anything. meson passes
# GRADGATE, BENCH, LINKEM and MAKE_CERTS (as to the integration tests) and
# TEST_NCCL_MODE, the rank program.
set -euo pipefail
: "${TEST_NCCL_MODE:?}"
# shellcheck source=rank_mesh.sh
. "$(dirname "$0")/rank_mesh.sh"
rank_mesh_init "$TEST_NCCL_MODE"
# shellcheck source=../integration/lib.sh
. "$(dirname "$0")/../integration/lib.sh"

K=2
# Headroom for the first step, in which NCCL's communicator comes up.
STEP_TIMEOUT=30s
RANK_LIMIT=120
RANKS=2
JOB=ncclmode
# NCCL's own sockets on loopback, whatever network plugin the machine has;
# its warnings (why a communicator did not come up) go to each .err file.
export NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1 NCCL_NET=Socket NCCL_DEBUG=WARN NCCL_HOSTID=gradgate-gateway
# The ranks load libnccl.so.2 by name: the gateway's, which a communicator
# needs (one NCCL version), though the loader's cache may not know its folder.
nccl_so=$(ldd "$GRADGATE" | awk '$1 == "libnccl.so.2" && $3 ~ /^\// { print $3 }')
if [ -n "$nccl_so" ]; then
	LD_LIBRARY_PATH=$(dirname "$nccl_so")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
	export LD_LIBRARY_PATH
fi

mesh_start
mesh_up 15
log "mesh up; starting $RANKS ranks at each of $K sites"
rank_mesh_start "$TEST_NCCL_MODE" "$JOB"
check_ranks # each exited 0, with the same digest
for name in "${names[@]}"; do
	grep '^ok case' "$work/$name.out" | sed "s/^/$name: /"
done
log "ok: $K sites x $RANKS ranks through NCCL, results equal to the exact sums, digest $checked_digest"
mesh_stop
