#!/usr/bin/env bash
# gradgate-bench transport --plain sends no benchmark data unencrypted to a
# receiver that did not say it takes it: a listener that never answers the
# hello gets its 32 bytes and nothing more, and a receiver started without
# --allow-plain makes the sender fail, saying so; with --allow-plain the
# plain baseline runs.
#
#   bench_plain.sh BENCH MAKE_CERTS PYTHON
set -euo pipefail

bench=${1:?usage: bench_plain.sh BENCH MAKE_CERTS PYTHON} make_certs=${2:?} python=${3:?}
tmp=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

"$make_certs" --out "$tmp/certs" site-a site-b >/dev/null
sender=(--ca "$tmp/certs/ca.pem" --cert "$tmp/certs/site-a.pem" --key "$tmp/certs/site-a.key"
	--peer-identity dns:site-b.gradgate.test --plain --time 0.2 --rtt-count 0 --modes TLS_AES_128_GCM_SHA256)
receiver=(--ca "$tmp/certs/ca.pem" --cert "$tmp/certs/site-b.pem" --key "$tmp/certs/site-b.key"
	--peer-identity dns:site-a.gradgate.test)

# A listener that takes what comes for a second after the last byte.
"$python" - "$tmp/port" >"$tmp/got" <<'PY' &
import socket, sys
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen(8)
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(s.getsockname()[1]))
import os
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
s.settimeout(20)
c, _ = s.accept()
c.settimeout(1.0)
n = 0
try:
    while True:
        d = c.recv(65536)
        if not d:
            break
        n += len(d)
except socket.timeout:
    pass
print(n, flush=True)
PY
pids+=("$!")
for _ in $(seq 100); do [ -s "$tmp/port" ] && break; sleep 0.05; done
[ -s "$tmp/port" ] || fail "the listener did not start"
rc=0
timeout 30 "$bench" transport --connect "127.0.0.1:$(cat "$tmp/port")" "${sender[@]}" >/dev/null 2>"$tmp/err" || rc=$?
wait "${pids[0]}"
[ "$(cat "$tmp/got")" = 32 ] || fail "a listener that never answered got $(cat "$tmp/got") bytes, not the 32 of the hello"
[ "$rc" != 0 ] || fail "the sender exited 0 against a listener that never took plain transport"
grep -qF "plain: stream 0: the server refused unencrypted transport (start it with --allow-plain to measure plain mode)" \
	"$tmp/err" || fail "the sender did not say why: $(cat "$tmp/err")"

# serve NAME [--allow-plain]: a receiver on a port the kernel picks, which
# it says in NAME.out; sets port.
serve() {
	timeout 60 "$bench" transport serve --listen 127.0.0.1:0 "${receiver[@]}" "${@:2}" >"$tmp/$1.out" 2>&1 &
	pids+=("$!")
	for _ in $(seq 100); do grep -q 'listening on' "$tmp/$1.out" && break; sleep 0.05; done
	port=$(sed -n 's/.*listening on 127\.0\.0\.1:\([0-9]*\) .*/\1/p' "$tmp/$1.out")
	[ -n "$port" ] || fail "the receiver did not start: $(cat "$tmp/$1.out")"
}
serve strict
rc=0
timeout 30 "$bench" transport --connect "127.0.0.1:$port" "${sender[@]}" >"$tmp/out" 2>"$tmp/err" || rc=$?
[ "$rc" = 1 ] || fail "against a receiver without --allow-plain the sender exited $rc, not 1"
grep -qF "the server refused unencrypted transport" "$tmp/err" || fail "the sender did not say why: $(cat "$tmp/err")"
grep -q '^TLS_AES_128_GCM_SHA256 ' "$tmp/out" || fail "the TLS mode did not run on: $(cat "$tmp/out")"
grep -qF "refused an unencrypted connection from 127.0.0.1" "$tmp/strict.out" ||
	fail "the receiver did not log the refusal: $(cat "$tmp/strict.out")"

serve open --allow-plain
timeout 30 "$bench" transport --connect "127.0.0.1:$port" "${sender[@]}" >"$tmp/out" 2>"$tmp/err" ||
	fail "against a receiver with --allow-plain the sender failed: $(cat "$tmp/err")"
grep -q '^plain (INSECURE) ' "$tmp/out" || fail "no plain row: $(cat "$tmp/out")"
echo "ok: the hello alone reaches a receiver that does not take plain transport"
