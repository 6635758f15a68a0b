#!/usr/bin/env python3
"""gradgate-bench codec at its smallest: every codec on every kind of data,
each line's figures consistent with what the codec is, and a refused codec
name. Not a measurement: the figures are checked for sense, not speed.

    codec_bench_smoke.py GRADGATE_BENCH
"""
import json
import subprocess
import sys

bench = sys.argv[1]
problems = []

run = subprocess.run([bench, "codec", "--size", "1MiB", "--reps", "1", "--no-zstd", "--json"],
                     capture_output=True, text=True, timeout=120)
if run.returncode != 0:
    sys.exit(f"gradgate-bench codec exited {run.returncode}: {run.stderr.strip()}")
lines = [json.loads(line) for line in run.stdout.splitlines() if line.strip()]
codecs = [x for x in lines if "codec" in x]
crcs = [x for x in lines if "checksum" in x]

# Encoded bytes per fp32 element, without zstd: int8/int4 carry one fp32
# scale per block of 256; each 1 MiB frame has a header of a few dozen
# bytes on top (0.1% is more than it).
want_ratio = {"fp32": 1.0, "bf16": 2.0, "bf16-split": None, "int8": 4 / (1 + 4 / 256),
              "int4": 4 / (0.5 + 4 / 256)}
seen = {(x["codec"], x["data"]) for x in codecs}
for codec in want_ratio:
    for data in ("gaussian", "heavy", "outliers"):
        if (codec, data) not in seen:
            problems.append(f"no line for {codec} on {data}")
for x in codecs:
    what = f"{x['codec']} on {x['data']}"
    want = want_ratio.get(x["codec"])
    if want is not None and abs(x["ratio"] - want) > 1e-3 * want:
        problems.append(f"{what}: ratio {x['ratio']}, expected {want:.4f}")
    if x["codec"] == "fp32" and (x["max_err_rel"] != 0 or x["rms_err_rel"] != 0):
        problems.append(f"{what}: fp32 must be exact, errors {x['max_err_rel']} {x['rms_err_rel']}")
    if x["codec"] != "fp32" and not 0 < x["rms_err_rel"] <= x["max_err_rel"]:
        problems.append(f"{what}: errors rms {x['rms_err_rel']} max {x['max_err_rel']} out of order")
    if x["codec"] == "bf16" and x["rms_err_rel"] > 2 ** -8:
        problems.append(f"{what}: bf16 rms error {x['rms_err_rel']} past 2^-8 of the RMS")
    for k in ("encode_gbps", "decode_gbps", "decode_acc_gbps"):
        if not x[k] > 0:
            problems.append(f"{what}: {k} {x[k]}")
if not crcs or sum(1 for x in crcs if x.get("used")) != 1:
    problems.append(f"CRC-32C lines: want at least one, one of them used; got {crcs}")

bad = subprocess.run([bench, "codec", "--codec", "int9"], capture_output=True, text=True, timeout=30)
if bad.returncode == 0 or "unknown codec 'int9'" not in bad.stderr:
    problems.append(f"--codec int9: exit {bad.returncode}, stderr {bad.stderr.strip()!r}; want a refusal naming it")

for p in problems:
    print("FAIL:", p)
print(f"codec bench smoke: {len(codecs)} codec lines, {len(crcs)} CRC lines, {len(problems)} problem(s)")
sys.exit(1 if problems else 0)
