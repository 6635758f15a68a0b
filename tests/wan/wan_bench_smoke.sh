#!/usr/bin/env bash
# gradgate-bench wan at its smallest: 2 sites of 1 rank, 64 KiB, 2 timed
# steps, fp32 ring only, and gloo where torch imports. Every JSON row must
# carry its fields, and nothing of the run may be left behind: no network
# namespace with its prefix, no process, no temporary folder. Skips (77)
# without root or where network namespaces cannot be made.
#
#   wan_bench_smoke.sh BENCH
set -euo pipefail

bench=${1:?usage: wan_bench_smoke.sh BENCH}
prefix=ggs$$
. "$(dirname "$0")/wan_lib.sh"

wan_run --sites 2 --ranks 1 --sizes 64KiB --steps 2 --warmup 1 --repeat 1 --codecs fp32 --algorithms ring

gloo=0
if /usr/bin/python3 -c 'import torch.distributed' 2>/dev/null; then
	gloo=1
fi
python3 - "$tmp/out" "$gloo" <<'PY' || fail "the JSON rows are not what they should be"
import json, sys
fields = ["mode", "system", "codec", "algorithm", "zstd_level", "size_bytes", "sites", "ranks", "rate_bps",
          "delay_ms", "congestion", "steps", "warmup", "repeats", "step_ms_p50", "step_ms_p90", "p50_ms_min", "p50_ms_median",
          "p50_ms_max", "model_ms", "ratio_model", "ratio_gloo", "cpu_s_per_gb", "wire_bytes_per_step",
          "model_link_bytes_per_step", "link_bytes_per_step", "drops_per_step", "hedged_frames_per_step",
          "other_cpu_share_max"]
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
want = ["gradgate fp32 ring"] + (["gloo"] if sys.argv[2] == "1" else [])
assert sorted(r["mode"] for r in rows) == sorted(want), [r["mode"] for r in rows]
for r in rows:
    missing = [f for f in fields if f not in r]
    assert not missing, (r["mode"], missing)
    assert r["size_bytes"] == 65536 and r["sites"] == 2 and r["ranks"] == 1, r
    for f in ["step_ms_p50", "step_ms_p90", "model_ms", "ratio_model", "cpu_s_per_gb", "wire_bytes_per_step",
              "model_link_bytes_per_step", "link_bytes_per_step"]:
        assert r[f] > 0, (r["mode"], f, r[f])
    assert r["p50_ms_min"] <= r["step_ms_p50"] <= r["p50_ms_max"], r
    assert (r["ratio_gloo"] is None) == (sys.argv[2] != "1"), r
print("rows:", ", ".join(r["mode"] for r in rows))
PY

if ip netns list | grep -E "^${prefix}(hub|s[0-9]+)( |\$)"; then
	fail "network namespaces of the run are left"
fi
# A gloo rank is known by its arguments: a build elsewhere on the machine
# may name the script too.
if pgrep -a -f -- "gradgate-wan-${prefix}\\.|wan_gloo\\.py --rank "; then
	fail "processes of the run are left"
fi
if compgen -G "${TMPDIR:-/tmp}/gradgate-wan-${prefix}.*" >/dev/null; then
	fail "the run's temporary folder is left: $(compgen -G "${TMPDIR:-/tmp}/gradgate-wan-${prefix}.*")"
fi
echo "nothing left behind"
