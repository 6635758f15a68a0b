#!/usr/bin/env bash
# One 64 Mi-element fp32 step between two sites (256 MiB per rank), exact
# at both; in the 'slow' suite.
. "$(dirname "$0")/lib.sh"

K=2
ALGO=ring
STEP_TIMEOUT=180s
CHUNK=1MiB
SOCKET_BUFFER=4MiB
RANK_LIMIT=400
mesh_start
mesh_up 15
run_ok large $((64 << 20)) 1 1
log "$(sed -n 's/.*\(step_ms_p50=[^ ]*\).*\(gbps=[^ ]*\).*/\1 \2/p' "$work/large-s0-r0.out")"
mesh_stop
