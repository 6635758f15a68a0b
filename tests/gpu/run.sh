#!/usr/bin/env bash
# Builds and runs every check that needs a GPU, in one go (a few minutes at
# most): the kernel self-test, the codec kernels against the CPU reference
# bit for bit (test_codec_cuda), their speed against cudaMemcpy on 256 MiB
# (test_codec_cuda_speed, which prints the figures), the step engine with
# its tensors in device memory (allreduce-cuda), GPU mode end to end
# (gpu-mode: two gateways and four ranks all-reducing device memory;
# nccl-mode: the same through each site's NCCL communicator; and
# gpu-torch, gpu-train-ddp and gpu-train-ddp-nccl, the same from PyTorch
# when its Python has torch), the NCCL smoke test, and whatever else the
# 'gpu' test suite holds. Run it from anywhere on a machine with a GPU and
# the build dependencies; it builds only those tests and the programs they
# run, prints each one's output and a summary, and exits non-zero if any
# check failed or none ran.
set -uo pipefail
cd "$(dirname "$0")/../.."
for d in /usr/local/cuda/bin /usr/local/cuda-*/bin; do
	[ -x "$d/nvcc" ] && { PATH="$d:$PATH"; break; }
done
export PATH
command -v nvcc >/dev/null || { echo "run.sh: nvcc not found; the GPU checks need the CUDA toolkit" >&2; exit 1; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || true

dir=build-gpu
if [ ! -f "$dir/build.ninja" ]; then
	log=$(mktemp)
	meson setup "$dir" -Dcuda=enabled -Dbuildtype=release >"$log" 2>&1 || { cat "$log"; rm -f "$log"; exit 1; }
	rm -f "$log"
fi
# meson test builds what the 'gpu' suite's tests need, and nothing else.
meson test -C "$dir" --suite gpu --verbose --num-processes 1
rc=$?
python3 - "$dir/meson-logs/testlog.json" <<'PY'
import json, re, sys
res = [json.loads(l) for l in open(sys.argv[1])]
# "gradgate:gpu / codec-cuda" (meson 1.0) or "gpu - gradgate:codec-cuda" (later).
short = lambda r: re.split(r" / |:", r["name"])[-1]
p = sum(r["result"] == "OK" for r in res)
s = sum(r["result"] == "SKIP" for r in res)
f = len(res) - p - s
for r in res:
    name = short(r)
    if name == "codec-cuda-speed" and r["result"] == "OK":
        print("codec kernel speed (test_codec_cuda_speed):")
        print(r["stdout"].rstrip())
    if name in ("gpu-train-ddp", "gpu-train-ddp-nccl") and r["result"] != "SKIP":
        print(f"DDP training on the GPU ({name}):")
        print("\n".join(l for l in r["stdout"].splitlines() if l.startswith(("parameters", "max |", "train_ddp", "buckets"))))
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
    print(f"  {short(r):<20} {r['result']:<5} {r['duration']:7.1f}s")
print(f"gpu: {p} passed, {f} failed, {s} skipped")
sys.exit(1 if f or p == 0 else 0)
PY
[ $? = 0 ] && [ $rc = 0 ]
