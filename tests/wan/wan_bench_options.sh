#!/usr/bin/env bash
# gradgate-bench wan refuses bad option values before it makes anything,
# with exit status 2 and a message that names the option and the value.
#
#   wan_bench_options.sh BENCH
set -euo pipefail

bench=${1:?usage: wan_bench_options.sh BENCH}
failed=0

# arguments | what the message must contain
cases=(
	"--sites 9|--sites must be 2 to 8, not '9'"
	"--ranks 0|--ranks must be 1 to 8, not '0'"
	"--rate 1gbt|--rate wants"
	"--rate 10kbit|'10kbit'"
	"--sizes 3|--sizes: '3'"
	"--sizes 1MiB,,4MiB|--sizes wants"
	"--codecs fp32,int9|--codecs: 'int9'"
	"--algorithms ring,tree|--algorithms: 'tree'"
	"--zstd-level 20|--zstd-level: '20'"
	"--delay-ms -1|--delay-ms must be 0 to 10000, not '-1'"
	"--steps 0|--steps must be 1 to 10000, not '0'"
	"--warmup x|--warmup must be 0 to 1000, not 'x'"
	"--repeat 101|--repeat must be 1 to 100, not '101'"
	"--streams 65|--streams must be 1 to 64, not '65'"
	"--chunk 1KiB|--chunk must be 4KiB to 64MiB, not '1KiB'"
	"--max-other-cpu 0|--max-other-cpu must be 1 to 100, not '0'"
	"--prefix Bad|--prefix wants"
	"--plot a'b.svg|--plot wants"
	"extra|unexpected argument 'extra'"
)
for c in "${cases[@]}"; do
	args=${c%%|*} want=${c#*|} rc=0
	# shellcheck disable=SC2086
	err=$("$bench" wan $args 2>&1 >/dev/null) || rc=$?
	if [ $rc != 2 ] || [[ $err != *"$want"* ]]; then
		echo "FAIL: wan $args: exit $rc, message: $err (wanted: $want)" >&2
		failed=1
	fi
done
[ $failed = 0 ] && echo "all ${#cases[@]} refused"
exit $failed
