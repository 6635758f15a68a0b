#!/usr/bin/env bash
# Builds and runs every check that needs a GPU, in one go (a few minutes at
# most): the kernel self-test, the NCCL smoke test, and whatever else the
# 'gpu' test suite holds. Run it from anywhere on a machine with a GPU and
# the build dependencies; it prints each check's output and a summary, and
# exits non-zero if any check failed or nothing ran.
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
	meson setup "$dir" -Dcuda=enabled -Dbuildtype=release >"$dir.log" 2>&1 || { cat "$dir.log"; exit 1; }
fi
ninja -C "$dir" || exit 1
meson test -C "$dir" --suite gpu --verbose --num-processes 1
rc=$?
python3 - "$dir/meson-logs/testlog.json" <<'PY'
import json, sys
res = [json.loads(l) for l in open(sys.argv[1])]
p = sum(r["result"] == "OK" for r in res)
s = sum(r["result"] == "SKIP" for r in res)
f = len(res) - p - s
print(f"gpu: {p} passed, {f} failed, {s} skipped")
sys.exit(1 if f or p == 0 else 0)
PY
[ $? = 0 ] && [ $rc = 0 ]
