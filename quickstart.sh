#!/usr/bin/env bash
# gradgate quickstart.
#
#   ./quickstart.sh        install missing build dependencies (apt-get), build
#                          into build/, make the demo certificates, run the live
#                          demo: three gateways on loopback, two ranks per site
#   ./quickstart.sh test   the same set-up, then every test suite in the normal
#                          build (build/, warnings as errors) and the ASan+UBSan
#                          build (build-asan/), and the threaded suites (gateway,
#                          integration) in the ThreadSanitizer build (build-tsan/)
#
# Both are idempotent: a second run rebuilds only what changed.
set -euo pipefail
cd "$(dirname "$0")"

mode=${1:-demo}
case "$mode" in
demo|test) ;;
-h|--help) sed -n '2,/^$/{/^#/!q;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
*) echo "quickstart.sh: unknown mode '$mode' (use no argument, or 'test')" >&2; exit 2 ;;
esac

# say WHAT: a step, with the seconds since the start (where the time goes).
say() { printf '==> [%4ds] %s\n' "$SECONDS" "$*"; }

# CUDA and NCCL live under the usual prefix; nvcc on PATH turns cuda/ on.
for d in /usr/local/cuda/bin /usr/local/cuda-*/bin; do
	if [ -x "$d/nvcc" ]; then
		PATH="$d:$PATH"
		break
	fi
done
export PATH

install_deps() {
	# dpkg-dev: meson asks its dpkg-architecture for Debian's library
	# folder (lib/x86_64-linux-gnu); without it, it picks lib64, which
	# neither the loader nor pkg-config reads.
	local pkgs=(meson ninja-build pkg-config dpkg-dev gcc clang libclang-rt-14-dev
		liburing-dev libssl-dev libzstd-dev openssl python3 iproute2 bc curl
		python3-numpy python3-torch)
	local missing=()
	for p in "${pkgs[@]}"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
	done
	[ ${#missing[@]} -eq 0 ] && return 0
	say "installing ${missing[*]}"
	local sudo=()
	if [ "$(id -u)" != 0 ]; then
		command -v sudo >/dev/null || {
			echo "quickstart.sh: missing packages (${missing[*]}); run as root or install them" >&2
			exit 1
		}
		sudo=(sudo)
	fi
	"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
	"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

# setup DIR [meson options...]: configure once; ninja re-runs meson by itself
# when a meson.build changes.
setup() {
	local dir=$1
	shift
	if [ ! -f "$dir/build.ninja" ]; then
		say "configuring $dir"
		meson setup "$dir" "$@" >"$dir.setup.log" 2>&1 || {
			cat "$dir.setup.log" >&2
			exit 1
		}
		# Where meson install would put the Python package (README, Install).
		[ "$dir" != build ] || sed -n '/^  Python package$/,/^$/p' "$dir.setup.log"
		rm -f "$dir.setup.log"
	fi
	say "building $dir"
	ninja -C "$dir" >/dev/null || ninja -C "$dir"
}

# Runs one build's tests; adds its counts to the totals.
passed=0 failed=0 skipped=0
run_tests() {
	local dir=$1 rc=0
	shift
	say "testing $dir"
	meson test -C "$dir" --print-errorlogs --num-processes 2 "$@" || rc=$?
	read -r p f s < <(python3 - "$dir" "$failures" <<'PY'
import json, sys
p = f = s = 0
for line in open(sys.argv[1] + "/meson-logs/testlog.json"):
    t = json.loads(line)
    r = t.get("result")
    if r in ("OK", "EXPECTEDFAIL"): p += 1
    elif r == "SKIP": s += 1
    else:
        f += 1
        # Kept for the end of the run: the lines that say why (a test's
        # FAIL comes before the logs it dumps), then the output's tail.
        lines = (t.get("stdout") or "").rstrip().splitlines()
        why = [l for l in lines[:-15] if l.startswith(("FAIL", "not ok"))][:5]
        with open(sys.argv[2], "a") as out:
            out.write(f"--- {sys.argv[1]}: {t['name']} ({r})\n")
            out.writelines(f"    {l}\n" for l in why + (["..."] if why else []) + lines[-15:])
print(p, f, s)
PY
)
	passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
	[ "$rc" = 0 ] || [ "$f" != 0 ] || failed=$((failed + 1))
}

install_deps
# The test run holds the code to warnings as errors (gcc here, clang below).
werror=()
[ "$mode" = test ] && werror=(--werror)
setup build "${werror[@]}"
[ -f examples/certs/ca.pem ] || examples/make-certs.sh

if [ "$mode" = demo ]; then
	say "checking the example site configs"
	build/gateway/gradgate --check-config examples/site-a.toml examples/site-b.toml examples/site-c.toml >/dev/null
	say "running the live demo (examples/demo.sh)"
	exec examples/demo.sh build
fi

# option DIR NAME VALUE: sets a meson option of a build configured earlier
# with another value (setup configures a new one only), and rebuilds.
option() {
	local now
	now=$(meson introspect "$1" --buildoptions | python3 -c 'import json, sys
print([str(o["value"]) for o in json.load(sys.stdin) if o["name"] == sys.argv[1]][0])' "$2")
	[ "$now" = "$3" ] && return
	meson configure "$1" "-D$2=$(echo "$3" | tr '[:upper:]' '[:lower:]')" >/dev/null
	ninja -C "$1" >/dev/null || ninja -C "$1"
}

# A build/ configured by the demo gets warnings as errors now.
option build werror True
# The sanitizer builds use clang; the AddressSanitizer one also builds the
# libFuzzer targets (the ThreadSanitizer one runs none of their tests).
# AddressSanitizer at -O1, as its authors advise: its tests run a sixth
# faster than at -O0, and it finds the same errors.
CC=clang setup build-asan -Db_sanitize=address,undefined -Db_lundef=false \
	-Ddebug=true -Doptimization=1 -Dcuda=disabled -Dnccl=disabled --werror
CC=clang setup build-tsan -Db_sanitize=thread -Db_lundef=false \
	-Dbuildtype=debugoptimized -Dcuda=disabled -Dnccl=disabled -Dfuzz=disabled --werror
option build-tsan fuzz disabled
failures=$(mktemp)
trap 'rm -f "$failures"' EXIT
run_tests build
UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 ASAN_OPTIONS=detect_leaks=1 run_tests build-asan --no-suite bulk \
	--no-suite timing
TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 run_tests build-tsan --suite gateway --suite integration \
	--no-suite bulk --no-suite one-thread --no-suite timing --no-suite same-threads
if [ -s "$failures" ]; then
	echo "quickstart: the tests that failed, with the end of their output:"
	cat "$failures"
fi
echo "quickstart: $passed passed, $failed failed, $skipped skipped, in $SECONDS s"
[ "$failed" = 0 ]
