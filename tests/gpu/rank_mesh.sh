# shellcheck shell=bash disable=SC2154 # work, K, RANKS, SITES, pids: lib.sh's and the script's
# What gpu_mode.sh and nccl_mode.sh share: the skip without a GPU, and the
# ranks of a rank program at every site of lib.sh's mesh.

# rank_mesh_init PROGRAM: exits 77 (skipped) when PROGRAM --probe finds no
# CUDA device, fails when it cannot run. (The script loads lib.sh itself:
# its declarations must be global.)
rank_mesh_init() {
	local probe_rc=0
	[ -x "$1" ] || { echo "not executable: $1" >&2; exit 1; }
	"$1" --probe || probe_rc=$?
	if [ "$probe_rc" = 77 ]; then
		exit 77
	elif [ "$probe_rc" != 0 ]; then
		echo "FAIL: $1 --probe exited $probe_rc" >&2
		exit 1
	fi
}

# rank_mesh_start PROGRAM JOB [ARGS...]: $RANKS ranks at each of the $K
# sites, as PROGRAM ENDPOINT JOB RANK RANKS SITE K ARGS..., the way lib.sh's
# rank_start starts bench ranks: direct children, output in
# $work/NAME.out and .err, awaited by check_ranks. Each has its own
# NCCL_HOSTID, which NCCL takes for its host.
rank_mesh_start() {
	local program=$1 job=$2 name s r
	shift 2
	names=()
	rank_pids=()
	rank_names=()
	for ((s = 0; s < K; s++)); do
		for ((r = 0; r < RANKS; r++)); do
			name=$job-s$s-r$r
			NCCL_HOSTID=gradgate-$name "$program" "unix:$work/${SITES[$s]}.sock" "$job" "$r" "$RANKS" "$s" "$K" \
				"$@" >"$work/$name.out" 2>"$work/$name.err" &
			rank_pids+=("$!")
			rank_names+=("$name")
			pids+=("$!")
			names+=("$name")
		done
	done
}
