#!/usr/bin/env bash
# gradgate-bench's commands and linkem refuse bad option values before
# they make or start anything, with exit status 2 and a message that names
# the option and the value.
#
#   bench_options.sh BENCH LINKEM
set -euo pipefail

bench=${1:?usage: bench_options.sh BENCH LINKEM}
linkem=${2:?usage: bench_options.sh BENCH LINKEM}
failed=0

# command and arguments | what the message must contain
cases=(
	"allreduce --ranks 1 --site 0 --sites 2 --rank x|--rank must be 0 to 4095, not 'x'"
	"allreduce --rank 0 --ranks 1 --site 0 --sites 2 --steps 5x|--steps must be 1 to 1000000, not '5x'"
	"allreduce --rank 0 --ranks 1 --site 0 --sites 2 --count 12abc|--count must be 1 to"
	"allreduce --rank 0 --ranks 1 --site 0 --sites 2 --inflight 9|--inflight must be 1 to 8, not '9'"
	"allreduce --rank 0 --ranks 1 --site 0 --sites 2 --codec fp16|--codec is fp32, bf16, bf16-split, int8 or int4, not 'fp16'"
	"allreduce --rank 0 --ranks 1 --site 0 --sites 2 extra|unexpected argument 'extra'"
	"allreduce --rank 0 --ranks 1 --site 0 --sites 2 --timeout-ms 100@0|--timeout-ms is MS or MS@STEP, not '100@0'"
	"allreduce --rank 0 --ranks 1 --site 0 --sites 2 --timeout-ms 100abc|--timeout-ms is MS or MS@STEP, not '100abc'"
	"transport --write-size 5x|--write-size must be 1B to 64MiB, not '5x' (unknown size unit"
	"transport --ring-size 1KiB|--ring-size must be 64KiB to 256MiB, not '1KiB'"
	"transport --time 0|--time must be 0.1 to 3600 seconds, not '0'"
	"transport --time 1e-9|--time must be 0.1 to 3600 seconds, not '1e-9'"
	"transport --listen 127.0.0.1:7443|--listen is an option of the receiver (transport serve)"
	"transport --allow-plain|--allow-plain is an option of the receiver (transport serve)"
	"transport --rate 5zz|--rate 5zz: expected a rate like 2G, 500M or 100k"
	"transport --rate inf|--rate inf: expected a rate like 2G, 500M or 100k, or 2gbit (bits per second, 1k to 10000G)"
	"transport --rate 2e10G|--rate 2e10G: expected a rate"
	"transport --socket-buffer 4KiB|--socket-buffer must be 64KiB to 256MiB, not '4KiB'"
	"codec --level 0|--level wants 1 to 19, as [compression] zstd_level"
	"codec --level 22|--level wants 1 to 19, as [compression] zstd_level"
	"allreduce --rank 0 --ranks 1 --site 0 --sites 2 --late 5|--late is MS@STEP, e.g. 3000@2, not '5'"
	"allreduce --rank 1 --ranks 1 --site 0 --sites 2|rank 1 of 1 ranks"
	"allreduce --rank 0 --ranks 1 --site 0 --sites 2 --endpoint bogus|--endpoint: endpoint 'bogus' is not unix:/absolute/path"
	"allreduce --rank 0 --ranks 1 --site 0 --sites 2 --job a/b|--job 'a/b': "
	"allreduce --ranks 1|--rank, --ranks, --site and --sites are required"
	"codec --bogus|unknown option '--bogus'"
	"codec extra|unknown argument 'extra'"
	"codec --reps 0|--reps must be 1 to 1000, not '0'"
	"codec --chunk 4097|--chunk must be 4KiB to 64MiB, whole fp32 elements (a multiple of 4 bytes), not '4097'"
	"codec --chunk 100GiB|--chunk must be 4KiB to 64MiB"
	"codec --size 10|--size must be 4B to 4GiB, whole fp32 elements (a multiple of 4 bytes), not '10'"
	"codec --size 1TiB|--size must be 4B to 4GiB"
	"gateway --threads 3 --streams 2|--threads 3: more lanes than --streams 2 would leave lanes idle"
	"gateway --threads 3|--threads 3: more lanes than --streams 2 (the default) would leave lanes idle"
	"gateway --chunk 1KiB|--chunk must be 4KiB to 64MiB"
	"datapath --chunk 1KiB|--chunk must be 4KiB to 64MiB"
	"codec --threads 2|not '2'"
	"transport --ca ca.pem --cert a.pem --key a.key --peer-identity bogus|--peer-identity bogus: an identity is"
	"transport serve --listen 127.0.0.1:99999 --ca ca.pem --cert a.pem --key a.key --peer-identity dns:a|--listen 127.0.0.1:99999: the port"
	"transport --connect nohostport --ca ca.pem --cert a.pem --key a.key --peer-identity dns:a|--connect nohostport:"
	"gateway --count 0|--count must be 1 to 268435456 elements, not '0'"
	"gateway --baseline-time -1|--baseline-time must be 0 to 60 seconds, not '-1'"
	"transport --bogus|unknown option '--bogus'"
	"transport extra|unknown argument 'extra'"
	"transport --time 1x|--time must be 0.1 to 3600 seconds, not '1x'"
	"transport --streams 0|--streams must be 1 to 32, not '0'"
	"transport --modes foo|unknown TLS 1.3 ciphersuite 'foo'"
	"gateway extra|unexpected argument 'extra'"
	"datapath extra|unexpected argument 'extra'"
	"wan --sites 9|--sites must be 2 to 8, not '9'"
	"wan --ranks 0|--ranks must be 1 to 8, not '0'"
	"wan --rate 1gbt|--rate wants"
	"wan --rate 10kbit|'10kbit'"
	"wan --rate 2Gbps/s|'2Gbps/s'"
	"wan --sizes 3|--sizes: '3'"
	"wan --sizes 1MiB,,4MiB|--sizes wants"
	"wan --codecs fp32,int9|--codecs: 'int9'"
	"wan --algorithms ring,tree|--algorithms: 'tree'"
	"wan --zstd-level 20|--zstd-level: '20'"
	"wan --delay-ms -1|--delay-ms must be 0 to 10000, not '-1'"
	"wan --steps 0|--steps must be 1 to 10000, not '0'"
	"wan --warmup x|--warmup must be 0 to 1000, not 'x'"
	"wan --repeat 101|--repeat must be 1 to 100, not '101'"
	"wan --streams 65|--streams must be 1 to 64, not '65'"
	"wan --chunk 1KiB|--chunk must be 4KiB to 64MiB, whole fp32 elements (a multiple of 4 bytes), not '1KiB'"
	"wan --chunk 4097|not '4097'"
	"wan --plot a.png|--plot wants an SVG file name"
	"wan --max-other-cpu 0|--max-other-cpu must be 1 to 100, not '0'"
	"wan --prefix Bad|--prefix wants"
	"wan --congestion Bbr|--congestion wants a congestion control's name (1 to 15 of a-z 0-9 _), not 'Bbr'"
	"wan --plot a'b.svg|--plot wants"
	"wan extra|unexpected argument 'extra'"
	"wan --sizes 1MiB,1024KiB|--sizes: '1024KiB' repeats '1MiB' in '1MiB,1024KiB'"
	"wan --codecs fp32,int8,fp32|--codecs: 'fp32' repeats 'fp32' in 'fp32,int8,fp32'"
	"wan --zstd-level 1,01|--zstd-level: '01' repeats '1'"
	"wan --plot /nonexistent/x.svg|--plot /nonexistent/x.svg: cannot write there: folder /nonexistent/: No such file or directory"
	"codec --codec fp32,,int8|--codec 'fp32,,int8': an empty item in the codec list"
	"codec --data ,|--data ',': an empty item in the data kind list"
	"codec --no-zstd --level 3|--level and --no-zstd contradict each other"
	"codec --file /|--file /: is a folder"
	"wan --cleanup --sizes 1MiB|--cleanup takes --prefix only, not --sizes"
	"wan --bogus|wan: unknown option '--bogus' (see --help)"
	"wan --sites|wan: --sites needs a value (see --help)"
	"allreduce -q|allreduce: unknown option '-q' (see --help)"
	"allreduce --rank|allreduce: --rank needs a value (see --help)"
	"gateway --count|gateway: --count needs a value (see --help)"
	"datapath --bogus=3|datapath: unknown option '--bogus=3' (see --help)"
)
check() { # PROGRAM ARGS|WANT [STATUS]
	local args=${2%%|*} want=${2#*|} status=${3:-2} rc=0 err
	# shellcheck disable=SC2086
	err=$(timeout 10 "$1" $args 2>&1 >/dev/null) || rc=$? # a value taken by mistake would run on
	# ... once: one line, not the parser's and a vaguer one (or the usage)
	# after it.
	if [ $rc != "$status" ] || [[ $err != *"$want"* ]] || [[ $err == *$'\n'* ]]; then
		echo "FAIL: $(basename "$1") $args: exit $rc, message: $err (wanted: $want, exit $status)" >&2
		failed=1
	fi
}
for c in "${cases[@]}"; do
	check "$bench" "$c"
done
# What the machine lacks is exit 3; as root (below the check of its
# privileges), a program a path option names that cannot run. The run
# would go on without the fault: the timeout ends it.
cannot=()
if [ "$(id -u)" = 0 ]; then
	cannot=(
		"wan --python /nonexistent/python3|cannot run the Python that --python names: /nonexistent/python3: No such file or directory"
		"wan --python no-such-python3|cannot run the Python that --python names: no-such-python3: not found in PATH"
		"wan --gradgate /nonexistent/gradgate|cannot run the gateway (pass --gradgate): /nonexistent/gradgate"
	)
fi
for c in "${cannot[@]}"; do
	check "$bench" "$c" 3
done
# linkem: a value that is not all a number is refused, not read as 0.
linkem_cases=(
	"--listen 127.0.0.1:0 --target 127.0.0.1:9 --delay-ms x|--delay-ms must be a number of milliseconds from 0 to 60000, not 'x'"
	"--listen 127.0.0.1:0 --target 127.0.0.1:9 --delay-ms 5ms|not '5ms'"
	"--listen 127.0.0.1:0 --target 127.0.0.1:9 --buffer 4XiB|--buffer must be 4096 bytes to 1GiB, not '4XiB'"
	"--listen bad --target 127.0.0.1:9|--listen 'bad' is not a HOST:PORT that resolves"
	"--listen 127.0.0.1:0 --target 127.0.0.1|--target '127.0.0.1' is not a HOST:PORT that resolves"
)
for c in "${linkem_cases[@]}"; do
	check "$linkem" "$c"
done
[ $failed = 0 ] && echo "all $((${#cases[@]} + ${#cannot[@]} + ${#linkem_cases[@]})) refused"
exit $failed
