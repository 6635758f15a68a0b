#!/usr/bin/env bash
# Builds and runs every check that needs a GPU, in one go (under 5
# minutes): the kernel self-test, the codec kernels against the CPU
# reference bit for bit (test_codec_cuda), their speed against cudaMemcpy
# on 256 MiB (test_codec_cuda_speed, which prints the figures), the step
# engine with its tensors in device memory (allreduce-cuda, node-cuda), GPU
# mode end to end (gpu-mode: two gateways and four ranks all-reducing
# device memory; nccl-mode: the same through each site's NCCL
# communicator; and gpu-torch, gpu-train-ddp and gpu-train-ddp-nccl, the
# same from PyTorch when its Python has torch), the NCCL smoke test, and
# whatever else the 'gpu' test suite holds. Run it from anywhere on a
# machine with a GPU; it builds only those tests and the programs they run
# (in build-gpu/), prints each one's output and a summary, and exits
# non-zero if any check failed, any was not built, or none ran: 77 where
# no GPU is found and every check skipped for want of one. On a machine
# with a GPU a check that skips counts as failed too, but for the PyTorch
# tests where no PyTorch with CUDA is found; the summary gives every
# skip's reason.
#
#   tests/gpu/run.sh [--debs DIR] [--logs DIR] [--budget SECONDS]
#
# --debs DIR     Debian packages from tests/gpu/fetch-debs.sh, unpacked into
#                build-gpu-deps/ (nothing is installed) when this machine
#                lacks pkg-config, the liburing, OpenSSL or zstd headers, or
#                the openssl command.
# --logs DIR     the run's output (run.log, as it goes) and meson's test
#                logs, kept in DIR.
# --budget S     stop after S seconds from the start, set-up and build
#                included (default 285, so that the whole run takes less
#                than 5 minutes), and summarize what ran; the tests not
#                reached count as failed.
#
# NCCL: where PyTorch brings its own (the nvidia-nccl wheel), the gateway is
# built against that one too, since an NCCL communicator takes only ranks
# of one NCCL version and PyTorch's ranks use PyTorch's; otherwise the CUDA
# toolkit's. Either way its lib/ goes first on LD_LIBRARY_PATH, where the
# client library's ranks look for libnccl.so.2.
set -uo pipefail
cd "$(dirname "$0")/../.."
src=$PWD
debs= logs= budget=285 tee_pid=
started=$SECONDS
usage() {
	echo "usage: tests/gpu/run.sh [--debs DIR] [--logs DIR] [--budget SECONDS]" >&2
	exit 2
}
while [ $# -gt 0 ]; do
	case "$1" in
	--debs) [ $# -ge 2 ] || usage; debs=$(realpath "$2") || exit 2; shift 2 ;;
	--logs) [ $# -ge 2 ] || usage; mkdir -p "$2" && logs=$(realpath "$2") || exit 2; shift 2 ;;
	--budget)
		[ $# -ge 2 ] && [[ "$2" =~ ^[1-9][0-9]{0,4}$ ]] || { echo "run.sh: --budget wants seconds, 1-99999" >&2; exit 2; }
		budget=$2; shift 2 ;;
	-h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
	*) echo "run.sh: unknown argument '$1'" >&2; usage ;;
	esac
done
if [ -n "$logs" ]; then
	exec > >(tee "$logs/run.log") 2>&1
	tee_pid=$!
fi
say() { echo "run.sh: $*"; }
# bash's command -v names a file on PATH that cannot run when no other is found.
have() { local p; p=$(command -v "$1") && [ -x "$p" ]; }

for d in /usr/local/cuda/bin /usr/local/cuda-*/bin; do
	[ -x "$d/nvcc" ] && { PATH="$d:$PATH"; break; }
done
export PATH
have nvcc || { say "nvcc not found; the GPU checks need the CUDA toolkit" >&2; exit 1; }
nvidia-smi --query-gpu=name,driver_version,memory.total,compute_mode --format=csv,noheader 2>/dev/null || true
# gpu-mode, nccl-mode and the PyTorch tests put several processes on one GPU.
case $(nvidia-smi --query-gpu=compute_mode --format=csv,noheader 2>/dev/null | head -1) in
Exclusive_Process) say "the GPU's compute mode admits one process at a time: the tests of several processes on it will fail" ;;
Prohibited) say "the GPU's compute mode admits no process: every check on it will fail" ;;
esac
for tool in meson ninja; do
	have "$tool" || { say "$tool not found (apt-get install meson ninja-build, or pip)" >&2; exit 1; }
done

# The build dependencies, from --debs where the machine lacks them.
deps=$src/build-gpu-deps
missing=()
have pkg-config || missing+=(pkg-config)
for pc in liburing openssl libzstd; do
	have pkg-config && pkg-config --exists "$pc" || missing+=("$pc.pc")
done
have openssl || missing+=("the openssl command")
if [ ${#missing[@]} -gt 0 ]; then
	if [ -z "$debs" ]; then
		say "missing: ${missing[*]}; install them, or pass --debs with tests/gpu/fetch-debs.sh's packages" >&2
		exit 1
	fi
	say "missing: ${missing[*]}; unpacking $(find "$debs" -maxdepth 1 -name '*.deb' | wc -l) packages of $debs"
	rm -rf "$deps"
	mkdir -p "$deps/bin"
	for deb in "$debs"/*.deb; do
		if have dpkg-deb; then
			dpkg-deb -x "$deb" "$deps"
		else # a .deb is an ar archive; its files are in data.tar.*
			member=$(ar t "$deb" | grep '^data\.tar')
			case "$member" in *.xz) z=-J ;; *.zst) z=--zstd ;; *.gz) z=-z ;; *) z= ;; esac
			ar p "$deb" "$member" | tar -x ${z:+"$z"} -C "$deps"
		fi || { say "cannot unpack $deb" >&2; exit 1; }
	done
	libdir=$deps/usr/lib/x86_64-linux-gnu
	# The packages say /usr; here they live under $deps.
	sed -i "s#^\([a-z_]*\)=/usr#\1=$deps/usr#" "$libdir"/pkgconfig/*.pc
	export PKG_CONFIG_PATH=$libdir/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
	# Their headers count as the system's, as in /usr/include: -isystem
	# outranks pkg-config's -I, so -Wpedantic leaves them alone.
	# Debian keeps some (openssl/opensslconf.h) in the multiarch folder,
	# which the compiler looks for only under /usr/include.
	export CFLAGS="${CFLAGS:+$CFLAGS }-isystem $deps/usr/include/x86_64-linux-gnu -isystem $deps/usr/include"
	# Their programs run with their own libraries; nothing else does.
	for tool in pkg-config:pkgconf openssl:openssl; do
		if ! have "${tool%%:*}"; then
			printf '#!/bin/sh\nLD_LIBRARY_PATH=%s OPENSSL_CONF=%s exec %s "$@"\n' "$libdir" \
				"$deps/etc/ssl/openssl.cnf" "$deps/usr/bin/${tool#*:}" >"$deps/bin/${tool%%:*}"
			chmod +x "$deps/bin/${tool%%:*}"
		fi
	done
	PATH=$deps/bin:$PATH
	# The programs built here find liburing.so.2 and the others there, if
	# the machine has none of its own.
	export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$libdir
	for pc in liburing openssl libzstd; do
		pkg-config --exists "$pc" || { say "$pc: still not found after unpacking $debs" >&2; exit 1; }
	done
fi

# PyTorch's Python (the one tests/python/run.sh picks) and its NCCL.
py=
for cand in /usr/bin/python3 python3; do
	if have "$cand" && "$cand" -c 'import numpy, torch' 2>/dev/null; then
		py=$cand
		break
	fi
done
nccl_dir= nccl_opt= torch_gpu=0
if [ -n "$py" ]; then
	"$py" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' 2>/dev/null && torch_gpu=1
	say "PyTorch: $("$py" -c 'import torch
gpu = torch.cuda.is_available()
print(torch.__version__, "NCCL " + ".".join(map(str, torch.cuda.nccl.version())) if gpu else "(no GPU)")' 2>&1 |
		tail -1)"
	wheel=$("$py" -c 'import nvidia.nccl as n; print(list(n.__path__)[0])' 2>/dev/null)
	if [ -n "$wheel" ] && [ -f "$wheel/include/nccl.h" ] && [ -f "$wheel/lib/libnccl.so.2" ]; then
		# meson links libnccl.so, which the wheel leaves out.
		nccl_dir=$src/build-gpu-nccl
		rm -rf "$nccl_dir"
		mkdir -p "$nccl_dir/lib"
		ln -s "$wheel/include" "$nccl_dir/include"
		ln -s "$wheel/lib/libnccl.so.2" "$nccl_dir/lib/libnccl.so.2"
		ln -s libnccl.so.2 "$nccl_dir/lib/libnccl.so"
		nccl_opt=$nccl_dir
		say "NCCL: PyTorch's, $wheel"
	fi
fi
if [ -z "$nccl_dir" ]; then
	nccl_dir=$(dirname "$(dirname "$(command -v nvcc)")")
	say "NCCL: the CUDA toolkit's, if it has one ($nccl_dir)"
fi
for l in "$nccl_dir/lib" "$nccl_dir/lib64"; do
	[ -e "$l/libnccl.so.2" ] && export LD_LIBRARY_PATH=$l${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
done

dir=build-gpu
reconf=()
[ -f "$dir/build.ninja" ] && reconf=(--reconfigure)
log=$(mktemp)
meson setup "${reconf[@]}" "$dir" -Dcuda=enabled -Dbuildtype=release -Dnccl_dir="$nccl_opt" >"$log" 2>&1 ||
	{ cat "$log"; rm -f "$log"; exit 1; }
grep -E '^ *(CUDA kernels|NCCL) *:' "$log"
rm -f "$log"

# Every test the suite should hold; a machine without NCCL, bash, python3
# or openssl at set-up would leave some out without a word.
expected="gpu-selftest codec-cuda codec-cuda-speed allreduce-cuda node-cuda nccl-smoke gpu-mode nccl-mode gpu-torch
gpu-train-ddp gpu-train-ddp-nccl"
defined=$(meson test -C "$dir" --list --suite gpu --no-rebuild 2>/dev/null |
	sed -E 's#.* / ##; s#^gpu - ##; s#^gradgate:##')
not_built=()
for t in $expected; do
	grep -qx "$t" <<<"$defined" || not_built+=("$t")
done
[ ${#not_built[@]} -eq 0 ] || say "not built here: ${not_built[*]} (see the set-up's NCCL line)"

# meson test builds what the 'gpu' suite's tests need, and nothing else.
# A log of an earlier run must not pass for this one's.
rm -f "$dir"/meson-logs/testlog.json
left=$((budget - (SECONDS - started)))
[ "$left" -ge 10 ] || left=10
timeout -k 10 "$left" meson test -C "$dir" --suite gpu --verbose --num-processes 1
rc=$?
case $rc in 124 | 137) say "stopped at the budget of $budget s (set-up and build count too)" ;; esac
"$dir/gateway/gradgate" --version 2>/dev/null | sed 's/^/run.sh: /'
[ -n "$logs" ] && cp "$dir"/meson-logs/testlog.json "$dir"/meson-logs/testlog.txt "$logs"/ 2>/dev/null
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
python3 - "$dir/meson-logs/testlog.json" "$expected" "${not_built[*]}" "$gpus" "$torch_gpu" <<'PY'
import json, os, re, sys
path, expected, not_built = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
gpus, torch_gpu = int(sys.argv[4] or 0), sys.argv[5] == "1"
res = [json.loads(l) for l in open(path)] if os.path.exists(path) else []
# "gradgate:gpu / codec-cuda" (meson 1.0) or "gpu - gradgate:codec-cuda" (later).
short = lambda r: re.split(r" / |:", r["name"])[-1]
# Where a GPU is, a check may skip only for want of PyTorch with CUDA;
# any other skip hides a check that did not run.
def may_skip(name):
    if not gpus:
        return True
    return name.startswith(("gpu-torch", "gpu-train")) and not torch_gpu
p = sum(r["result"] == "OK" for r in res)
s = sum(r["result"] == "SKIP" and may_skip(short(r)) for r in res)
f = len(res) - p - s
for r in res:
    name = short(r)
    if name == "codec-cuda-speed" and r["result"] == "OK":
        print("codec kernel speed (test_codec_cuda_speed):")
        print(r["stdout"].rstrip())
    if name in ("gpu-train-ddp", "gpu-train-ddp-nccl") and r["result"] != "SKIP":
        print(f"DDP training on the GPU ({name}):")
        keep = ("parameters", "max |", "train_ddp", "buckets")
        print("\n".join(l for l in r["stdout"].splitlines() if l.startswith(keep)))
    if name == "gpu-torch" and r["result"] != "SKIP":
        print("GPU mode from PyTorch (gpu-torch):")
        print("\n".join(l for l in r["stdout"].splitlines() if l.startswith("torch cuda:")))
    if name == "nccl-mode" and r["result"] != "SKIP":
        print("GPU mode with NCCL (nccl-mode):")
        print("\n".join(l for l in r["stdout"].splitlines() if ": ok case" in l or " ok: " in l))
    if name == "gpu-mode" and r["result"] != "SKIP":
        print("GPU mode (gpu-mode):")
        print("\n".join(l for l in r["stdout"].splitlines() if " time " in l or " ok: " in l))
for r in res:
    why = ""
    if r["result"] == "SKIP":
        lines = [l for l in (r.get("stdout") or "").splitlines() if l.strip()]
        why = (" " if may_skip(short(r)) else " counted as failed, on a GPU machine: ") + (lines[-1] if lines else "")
    print(f"  {short(r):<20} {r['result']:<5} {r['duration']:7.1f}s{why}")
ran = {short(r) for r in res}
unrun = [t for t in expected if t not in ran and t not in not_built]
for t in not_built:
    print(f"  {t:<20} NOT BUILT")
for t in unrun:
    print(f"  {t:<20} NOT RUN")
f += len(not_built) + len(unrun)
print(f"gpu: {p} passed, {f} failed, {s} skipped")
if not gpus and not f and not p and s:
    print("gpu: no GPU here: every check skipped")
    sys.exit(77)
sys.exit(1 if f or p == 0 else 0)
PY
summary=$?
# With --logs, the last lines (the summary) reach the output and run.log
# before this script ends.
if [ -n "$logs" ]; then
	exec >&- 2>&-
	wait "$tee_pid"
fi
[ $summary = 77 ] && exit 77
[ $summary = 0 ] && [ $rc = 0 ]
