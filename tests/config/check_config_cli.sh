#!/usr/bin/env bash
# gradgate --check-config as a person uses it: exit codes and what it prints.
#   check_config_cli.sh GRADGATE MAKE_CERTS
set -u
gradgate=$(realpath "$1") make_certs=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
expect() { # description, condition result
	if [ "$2" = 0 ]; then echo "ok   $1"; else echo "FAIL $1"; fail=1; fi
}

"$make_certs" --out "$tmp/certs" site-a site-b >/dev/null || { echo "FAIL make-certs.sh"; exit 1; }
cp "$tmp/certs/ca.pem" "$tmp/ca.pem"; cp "$tmp/certs/site-a.pem" "$tmp/cert.pem"
cp -p "$tmp/certs/site-a.key" "$tmp/key.pem"
cat >"$tmp/good.toml" <<TOML
[site]
name = "site-a"
listen = "127.0.0.1:7101"
[tls]
ca = "ca.pem"
cert = "cert.pem"
key = "key.pem"
[[peers]]
site = "site-b"
address = "127.0.0.1:7102"
TOML
sed 's/^listen = .*/listen = "127.0.0.1"/; s/^site = "site-b"/site = "site-a"/' "$tmp/good.toml" >"$tmp/bad.toml"

"$gradgate" --check-config "$tmp/good.toml" >"$tmp/out" 2>"$tmp/err"
expect "valid config exits 0" $?
grep -q '^name = "site-a"' "$tmp/out"; expect "resolved config names the site" $?
grep -q '^streams_per_peer = 4  # default;' "$tmp/out"; expect "defaults are printed and marked" $?
grep -q '^control = "unix:/run/gradgate/site-a.sock"  # default;' "$tmp/out" &&
	grep -q "^threads = $(python3 -c 'import os; print(min(len(os.sched_getaffinity(0)), 64))')  # default;" "$tmp/out" &&
	grep -q '^identity = "dns:site-b"  # default;' "$tmp/out"
expect "defaults that follow from other settings are marked too" $?
other=$(( $(python3 -c 'import os; print(len(os.sched_getaffinity(0)))') == 1 ? 2 : 1 ))
sed "s/^name = \"site-a\"/&\\ncontrol = \"unix:\\/tmp\\/x.sock\"\\nthreads = $other/" "$tmp/good.toml" >"$tmp/set.toml"
"$gradgate" --check-config "$tmp/set.toml" >"$tmp/out" 2>"$tmp/err"
grep -q '^control = "unix:/tmp/x.sock"  # local' "$tmp/out" && grep -q "^threads = $other  # threads" "$tmp/out"
expect "values the file sets apart from the defaults are not marked" $?
[ ! -s "$tmp/err" ]; expect "valid config prints nothing on stderr" $?

"$gradgate" --check-config "$tmp/bad.toml" >"$tmp/out" 2>"$tmp/err"
expect "invalid config exits 1" $(( $? != 1 ))
grep -qF "$tmp/bad.toml:3:10: 'listen' in [site]: \"127.0.0.1\" is not host:port (the port is missing)" "$tmp/err"
expect "problem names file:line:col and what is wrong" $?
grep -qF "[[peers]] #1 is site 'site-a', which is this site itself" "$tmp/err"; expect "every problem is reported" $?
grep -qF "$tmp/bad.toml: 2 problems found" "$tmp/err"; expect "problem count is summarised" $?
[ ! -s "$tmp/out" ]; expect "nothing on stdout for an invalid config" $?

# Relative paths print absolute: what --check-config prints loads back from
# any folder, and printed again reads the same but for the file it names.
mkdir -p "$tmp/sub/certs"
cp -p "$tmp/ca.pem" "$tmp/cert.pem" "$tmp/key.pem" "$tmp/sub/certs/"
sed -E 's#^(ca|cert|key) = "#&certs/#' "$tmp/good.toml" >"$tmp/sub/base.toml"
(cd "$tmp" && "$gradgate" --check-config sub/base.toml >sub/printed.toml 2>"$tmp/err")
expect "config with relative paths exits 0" $?
grep -qF "ca = \"$tmp/sub/certs/ca.pem\"" "$tmp/sub/printed.toml"; expect "relative paths print absolute" $?
(cd "$tmp" && "$gradgate" --check-config sub/printed.toml >"$tmp/again.toml" 2>"$tmp/err")
expect "printed config loads back from the folder it was checked from" $?
(cd "$tmp/sub" && "$gradgate" --check-config printed.toml >"$tmp/again2.toml" 2>>"$tmp/err")
expect "printed config loads back from its own folder" $?
[ "$(tail -n +2 "$tmp/sub/printed.toml")" = "$(tail -n +2 "$tmp/again.toml")" ] &&
	[ "$(tail -n +2 "$tmp/again.toml")" = "$(tail -n +2 "$tmp/again2.toml")" ]
expect "printed again, the config reads the same" $?
[ ! -s "$tmp/err" ] || cat "$tmp/err"

# The credentials must be what they claim, not just readable files: the
# gateway would refuse to start on them (exit 3), so the check fails.
mkdir -p "$tmp/creds"
for c in garbage-cert other-key peer-cert; do
	cp "$tmp/ca.pem" "$tmp/cert.pem" "$tmp/creds/"
	cp -p "$tmp/key.pem" "$tmp/creds/"
	case $c in
	garbage-cert) printf 'x\n' >"$tmp/creds/cert.pem"; want="certificate '$tmp/creds/cert.pem' holds no PEM certificate" ;;
	other-key) cp -p "$tmp/certs/site-b.key" "$tmp/creds/key.pem"
		want="private key '$tmp/creds/key.pem' does not match certificate '$tmp/creds/cert.pem'" ;;
	# The peer's certificate and key: they match, but they are site-b's.
	peer-cert) cp "$tmp/certs/site-b.pem" "$tmp/creds/cert.pem"; cp -p "$tmp/certs/site-b.key" "$tmp/creds/key.pem"
		want="certificate '$tmp/creds/cert.pem' names peer site-b (dns:site-b.gradgate.test): it is that site's, or passes for it, and no site's own may: with it this site could speak as that one" ;;
	esac
	cp "$tmp/good.toml" "$tmp/creds/$c.toml"
	# ([[peers]] is good.toml's last table.)
	[ "$c" != peer-cert ] || echo 'identity = "dns:site-b.gradgate.test"' >>"$tmp/creds/$c.toml"
	"$gradgate" --check-config "$tmp/creds/$c.toml" >"$tmp/out" 2>"$tmp/err"
	expect "$c exits 1" $(( $? != 1 ))
	grep -qF "$tmp/creds/$c.toml: $want" "$tmp/err"; expect "$c is named" $?
	grep -qF "$tmp/creds/$c.toml: 1 problem found" "$tmp/err"; expect "$c is counted" $?
	[ ! -s "$tmp/out" ]; expect "$c prints nothing on stdout" $?
done
# cert and key swapped: said so, not as a key file whose mode is loose (a
# certificate's is, rightly).
cp "$tmp/cert.pem" "$tmp/creds/"
cp -p "$tmp/key.pem" "$tmp/creds/"
sed 's/^cert = .*/cert = "key.pem"/; s/^key = .*/key = "cert.pem"/' "$tmp/good.toml" >"$tmp/creds/swapped.toml"
chmod 600 "$tmp/creds/swapped.toml"
"$gradgate" --check-config "$tmp/creds/swapped.toml" >/dev/null 2>"$tmp/err"
expect "swapped cert and key exit 1" $(( $? != 1 ))
grep -qF "[tls] key file '$tmp/creds/cert.pem' holds a certificate, not a private key: are [tls] cert and key swapped?" "$tmp/err"
rc=$?; expect "swapped cert and key are named: $(head -c 300 "$tmp/err")" $rc
! grep -q chmod "$tmp/err"; expect "swapped cert and key: no chmod advice" $?

"$gradgate" --check-config "$tmp/good.toml" "$tmp/bad.toml" >/dev/null 2>&1
expect "one bad file among several exits 1" $(( $? != 1 ))

"$gradgate" --check-config "$tmp/missing.toml" >/dev/null 2>"$tmp/err"
expect "missing file exits 1" $(( $? != 1 ))
grep -qF "$tmp/missing.toml: cannot read config: No such file or directory" "$tmp/err"; expect "missing file is named" $?

"$gradgate" --check-config "$tmp" >/dev/null 2>"$tmp/err"
grep -qF "$tmp: cannot read config: Is a directory" "$tmp/err"; expect "a folder is refused" $?

# A control socket folder others may write in: the gateway would refuse to
# start, so the check fails too, naming the folder.
mkdir -m 777 "$tmp/open" && chmod 777 "$tmp/open"
sed "s#^name = \"site-a\"#&\ncontrol = \"unix:$tmp/open/gw/a.sock\"#" "$tmp/good.toml" >"$tmp/open.toml"
"$gradgate" --check-config "$tmp/open.toml" >"$tmp/out" 2>"$tmp/err"
expect "a control socket folder others may write in fails the check (exit 1)" $(( $? != 1 ))
grep -qF "$tmp/open.toml:3:11: control socket $tmp/open/gw/a.sock: folder $tmp/open (mode 0777) may be written by every user, without the sticky bit" "$tmp/err"
expect "it names the folder and why" $?

# The same for the CA's folder: whoever may write in it could put a CA
# of their own in its place; the sticky bit keeps them off it (as /tmp's).
mkdir -m 777 "$tmp/open/certs" && chmod 777 "$tmp/open/certs" && cp "$tmp/ca.pem" "$tmp/open/certs/ca.pem"
sed "s#^ca = .*#ca = \"open/certs/ca.pem\"#" "$tmp/good.toml" >"$tmp/openca.toml"
"$gradgate" --check-config "$tmp/openca.toml" >"$tmp/out" 2>"$tmp/err"
expect "a CA file in a folder others may write in fails the check (exit 1)" $(( $? != 1 ))
grep -qF "$tmp/openca.toml:5:6: [tls] ca file '$tmp/open/certs/ca.pem': folder $tmp/open (mode 0777) may be written by every user, without the sticky bit: they could put another file in its place, and so choose whom this gateway trusts (run chmod go-w on it)" "$tmp/err"
rc=$?; expect "  naming the folder and why: $(head -c 300 "$tmp/err")" $rc
chmod 1777 "$tmp/open/certs" "$tmp/open"
"$gradgate" --check-config "$tmp/openca.toml" >/dev/null 2>"$tmp/err"
rc=$?; expect "with the sticky bit on it and above, it passes: $(head -c 300 "$tmp/err")" $rc
chmod 777 "$tmp/open"

# The config itself names the CA, the key and the peers: whoever may write
# or replace it chooses whom the gateway trusts, so it is held to the CA
# file's rules, by the check and at start (exit 1, before anything else).
cp "$tmp/good.toml" "$tmp/shared.toml" && chmod 0664 "$tmp/shared.toml"
"$gradgate" --check-config "$tmp/shared.toml" >/dev/null 2>"$tmp/err"
expect "a config its group may write fails the check (exit 1)" $(( $? != 1 ))
grep -qxF "$tmp/shared.toml: the config file may be written by group or others (mode 0664), who could so choose whom this gateway trusts; run: chmod go-w '$tmp/shared.toml'" "$tmp/err"
rc=$?; expect "  saying why and what to run: $(head -c 300 "$tmp/err")" $rc
timeout 10 "$gradgate" --config "$tmp/shared.toml" >/dev/null 2>"$tmp/err"
expect "  and the gateway does not start on it (exit 1)" $(( $? != 1 ))
grep -qF "$tmp/shared.toml: the config file may be written by group or others (mode 0664)" "$tmp/err"
rc=$?; expect "  saying why: $(head -c 300 "$tmp/err")" $rc
# A named pipe others may write to is the same; what the caller opened
# itself (standard input, <(...)) is the caller's.
mkfifo -m 0666 "$tmp/shared-pipe.toml"
(sleep 0.3; timeout 5 cp "$tmp/good.toml" "$tmp/shared-pipe.toml") &
timeout 10 "$gradgate" --check-config "$tmp/shared-pipe.toml" >/dev/null 2>"$tmp/err"
expect "a named pipe others may write to fails the check (exit 1)" $(( $? != 1 ))
wait
grep -qF "$tmp/shared-pipe.toml: the config file may be written by group or others (mode 0666)" "$tmp/err"
rc=$?; expect "  saying why: $(head -c 300 "$tmp/err")" $rc
sed "s#^\(ca\|cert\|key\) = \"#&$tmp/#" "$tmp/good.toml" >"$tmp/shared-abs.toml" && chmod 0664 "$tmp/shared-abs.toml"
"$gradgate" --check-config /dev/stdin <"$tmp/shared-abs.toml" >/dev/null 2>"$tmp/err"
rc=$?; expect "a config on standard input is read whatever its file's mode: $(head -c 300 "$tmp/err")" $rc
"$gradgate" --check-config "/dev/fd/../..$tmp/shared-abs.toml" >/dev/null 2>"$tmp/err"
expect "a path through /dev/fd to a file is the file's, and judged (exit 1)" $(( $? != 1 ))
sed 's#^\(ca\|cert\|key\) = "#&../#' "$tmp/good.toml" >"$tmp/open/site.toml"
"$gradgate" --check-config "$tmp/open/site.toml" >/dev/null 2>"$tmp/err"
expect "a config in a folder others may write in fails the check (exit 1)" $(( $? != 1 ))
grep -qxF "$tmp/open/site.toml: the config file: folder $tmp/open (mode 0777) may be written by every user, without the sticky bit: they could put another file in its place, and so choose whom this gateway trusts (run chmod go-w on it)" "$tmp/err"
rc=$?; expect "  naming the folder: $(head -c 300 "$tmp/err")" $rc
chmod 1777 "$tmp/open"
"$gradgate" --check-config "$tmp/open/site.toml" >/dev/null 2>"$tmp/err"
rc=$?; expect "with the sticky bit on the folder, it passes: $(head -c 300 "$tmp/err")" $rc
chmod 777 "$tmp/open"

# A site's own certificate given as the CA: the check names what the CA
# file holds, and that it is no CA.
sed 's/^ca = .*/ca = "cert.pem"/' "$tmp/good.toml" >"$tmp/leaf-ca.toml"
chmod 600 "$tmp/leaf-ca.toml"
"$gradgate" --check-config "$tmp/leaf-ca.toml" >/dev/null 2>"$tmp/err"
expect "a certificate given as the CA fails the check (exit 1)" $(( $? != 1 ))
grep -qF "certificate '$tmp/cert.pem' does not pass the checks peers make with CA '$tmp/cert.pem': unable to get local issuer certificate: every peer would refuse it; its issuer is /O=gradgate/CN=gradgate demo CA" "$tmp/err" &&
	grep -qF "the CA file's certificates are /O=gradgate/CN=site-a (not a CA)" "$tmp/err"
rc=$?; expect "  naming the issuer and what the CA file holds: $(head -c 400 "$tmp/err")" $rc

"$gradgate" --check-config >/dev/null 2>"$tmp/err"
expect "no file is a usage error (exit 2)" $(( $? != 2 ))
"$gradgate" --frobnicate >/dev/null 2>&1
expect "unknown option is a usage error (exit 2)" $(( $? != 2 ))
"$gradgate" --version | grep -q '^gradgate [0-9]'; expect "--version prints the version" $?
"$gradgate" --version | grep -Eq '^protocols: between sites [0-9]+, with ranks [0-9]+$'; expect "--version prints the protocol versions" $?
"$gradgate" --check-config "$tmp/bad.toml" --version >"$tmp/out" 2>"$tmp/err"
expect "--version with --check-config is a usage error (exit 2), not a pass" $(( $? != 2 ))
grep -qF "gradgate: --version takes no other options or arguments" "$tmp/err"; expect "it says why" $?
[ ! -s "$tmp/out" ]; expect "and prints no version" $?
"$gradgate" --help extra >/dev/null 2>"$tmp/err"
expect "--help with an argument is a usage error (exit 2)" $(( $? != 2 ))
"$gradgate" --help >"$tmp/out" 2>"$tmp/err"
expect "--help exits 0" $?
head -n1 "$tmp/out" | grep -qF "usage: gradgate --config FILE [--log-level debug|info|warn|error]" && [ ! -s "$tmp/err" ]
expect "  with the usage on stdout, nothing on stderr" $?
"$gradgate" status --help >"$tmp/out" 2>"$tmp/err"
expect "status --help exits 0" $?
head -n1 "$tmp/out" | grep -qF "usage: gradgate status (--config FILE | --control unix:/PATH) [--json]" && [ ! -s "$tmp/err" ]
expect "  with status's usage on stdout, nothing on stderr" $?
"$gradgate" --config "$tmp/good.toml" --log-level loud >/dev/null 2>"$tmp/err"
expect "an unknown --log-level is a usage error (exit 2)" $(( $? != 2 ))
grep -qxF "gradgate: --log-level must be debug, info, warn or error" "$tmp/err"; expect "  naming the levels" $?
"$gradgate" --config "$tmp/good.toml" --check-config "$tmp/bad.toml" >/dev/null 2>"$tmp/err"
expect "--config with --check-config is a usage error (exit 2)" $(( $? != 2 ))
grep -qF "gradgate: --check-config takes the files to check as its arguments, not --config" "$tmp/err"
expect "it says why" $?
"$gradgate" --config "$tmp/good.toml" --config "$tmp/bad.toml" >/dev/null 2>"$tmp/err"
expect "--config twice is a usage error (exit 2), not the last one run" $(( $? != 2 ))
grep -qF "gradgate: --config is given twice ('$tmp/good.toml', then '$tmp/bad.toml')" "$tmp/err"
expect "it names both" $?

# refused NAME SED WHAT TEXT: good.toml as sed expression SED changes it
# fails the check (exit 1, within 10 s), saying TEXT.
refused() {
	sed "$2" "$tmp/good.toml" >"$tmp/$1.toml"
	timeout 10 "$gradgate" --check-config "$tmp/$1.toml" >/dev/null 2>"$tmp/err"
	expect "$3 fails the check (exit 1)" $(( $? != 1 ))
	grep -qF -- "$4" "$tmp/err"; expect "  saying: $4" $?
}

# Named pipes with no writer, as a [tls] file or as the config itself,
# must not hold the check for good: refused at once as a [tls] file; as
# the config, read once written to, refused when nothing is within 10 s.
mkfifo "$tmp/pipe.pem" "$tmp/pipe.toml"
refused fifo 's#^ca = .*#ca = "pipe.pem"#' "a named pipe as [tls] ca" "[tls] ca file '$tmp/pipe.pem' is not a regular file"
# A listen address the gateway could not listen on fails the check too,
# at the setting's place in the file, as every host check.
refused listen-name 's#^listen = .*#listen = "nonexistent.invalid:7101"#' "a listen host that does not resolve" \
	'[site] listen "nonexistent.invalid:7101": the host does not resolve to an address'
refused listen-foreign 's#^listen = .*#listen = "192.0.2.1:7101"#' "a listen address no interface has" \
	"$tmp/listen-foreign.toml:3:10: [site] listen \"192.0.2.1:7101\": no interface of this host has that address"
refused congestion '$a [transport]\ncongestion_control = "nosuchcc"' "a congestion control the kernel lacks" \
	"$tmp/congestion.toml:12:22: [transport] congestion_control \"nosuchcc\": this kernel has no such TCP congestion control"
refused metrics-foreign '$a [metrics]\nlisten = "192.0.2.1:9464"\nallow_remote = true' \
	"a [metrics] listen address no interface has, served to others" \
	"$tmp/metrics-foreign.toml:12:10: [metrics] listen 192.0.2.1:9464: no interface of this host has that address"
(sleep 0.5; timeout 5 cp "$tmp/good.toml" "$tmp/pipe.toml") &
timeout 10 "$gradgate" --check-config "$tmp/pipe.toml" >/dev/null 2>"$tmp/err"
rc=$?; expect "a named pipe written to half a second late is read (exit 0): $(head -c 200 "$tmp/err")" $rc
wait
timeout 20 "$gradgate" --check-config "$tmp/pipe.toml" >/dev/null 2>"$tmp/err"
expect "a named pipe nobody writes to fails the check (exit 1)" $(( $? != 1 ))
grep -qF "$tmp/pipe.toml: a pipe nothing was written to within 10 s" "$tmp/err"; expect "  saying so" $?
"$gradgate" --check-config <(sed "s#^\(ca\|cert\|key\) = \"#&$tmp/#" "$tmp/good.toml") >/dev/null 2>"$tmp/err"
rc=$?; expect "a config from a process substitution is read: $(head -c 200 "$tmp/err")" $rc
# What the gateway would refuse at start, the check refuses too.
refused ctl-dir 's#^name = "site-a"#&\ncontrol = "unix:/tmp/"#' "a control socket path that is a folder" \
	"$tmp/ctl-dir.toml:3:11: control socket /tmp/: the path exists and is not a socket"
refused ctl-deep "s#^name = \"site-a\"#&\ncontrol = \"unix:$tmp/no/such/a.sock\"#" \
	"a control socket two folders deep in nothing" \
	"control socket $tmp/no/such/a.sock: folder $tmp/no does not exist (the gateway makes only the socket's own folder)"
: >"$tmp/afile"
refused ctl-file "s#^name = \"site-a\"#&\ncontrol = \"unix:$tmp/afile/a.sock\"#" "a control socket under a file" \
	"control socket $tmp/afile/a.sock: $tmp/afile is not a folder"
# A folder whose file system makes no sockets, whatever its permissions.
if [ -d /proc/self ] && [ "$(id -u)" = 0 ]; then # (others lack write access there)
	refused ctl-proc 's#^name = "site-a"#&\ncontrol = "unix:/proc/a.sock"#' "a control socket in /proc" \
		"control socket /proc/a.sock: no socket can be made in /proc: "
fi
sed "s#^name = \"site-a\"#&\ncontrol = \"unix:$tmp/made//a.sock\"#" "$tmp/good.toml" >"$tmp/ctl-made.toml"
"$gradgate" --check-config "$tmp/ctl-made.toml" >/dev/null 2>"$tmp/err"
rc=$?; expect "a control socket in a folder the gateway makes passes, written with //: $(head -c 200 "$tmp/err")" $rc
# Long values keep their reason; control characters in file names are
# escaped in every line, the count's too.
long=$(head -c 3000 /dev/zero | tr '\0' a)
refused long "s#^address = \"127.0.0.1:7102\"#&\nidentity = \"uri:$long\"#" "a 3000-byte identity" \
	"aaaa\": a URI starts with a scheme"
refused longer "s#^address = \"127.0.0.1:7102\"#&\nidentity = \"uri:$long$long\"#" "a 6004-byte identity" \
	"'identity' in [[peers]] #1 is 6004 bytes long; it may be at most 4096 bytes"
deep=$tmp/$(head -c 200 /dev/zero | tr '\0' d)/$(head -c 200 /dev/zero | tr '\0' e)
mkdir -p "$deep" && printf '[site]\nname = "a"\nname = "b"\n' >"$deep/dup.toml"
"$gradgate" --check-config "$deep/dup.toml" >/dev/null 2>"$tmp/err"
grep -qF "$deep/dup.toml:3:1: duplicate key 'name'" "$tmp/err"; expect "a long file name keeps the TOML error's place and words" $?
printf '[site]\nname = 1\n' >"$tmp/two"$'\n'"lines.toml"
"$gradgate" --check-config "$tmp/two"$'\n'"lines.toml" >/dev/null 2>"$tmp/err"
[ "$(grep -c 'two\\x0alines.toml' "$tmp/err")" = "$(wc -l <"$tmp/err")" ]
expect "a newline in the file name is escaped on every line" $?
cp "$tmp/good.toml" "$tmp/good"$'\n'"name = 1.toml"
"$gradgate" --check-config "$tmp/good"$'\n'"name = 1.toml" >"$tmp/printed.toml" 2>"$tmp/err" &&
	"$gradgate" --check-config "$tmp/printed.toml" >/dev/null 2>>"$tmp/err"
rc=$?; expect "what it prints of a file with a newline in its name loads back: $(head -c 200 "$tmp/err")" $rc

# Files and folders of another user (as root, who may chown): a CA file
# whoever owns may replace is refused at its place in the file, saying to
# run the gateway as its owner or give it to root; and a gateway user who
# may not make the socket's folder (as /run/gradgate in /run) is told to
# make it, by the check and at start.
if [ "$(id -u)" = 0 ] && id nobody >/dev/null 2>&1 && id daemon >/dev/null 2>&1 && command -v runuser >/dev/null &&
	runuser -u nobody -- test -x "$gradgate"; then
	nobody=$(id -u nobody) daemon=$(id -u daemon)
	cp "$tmp/ca.pem" "$tmp/ca-nobody.pem"
	chown nobody "$tmp/ca-nobody.pem"
	refused owner 's#^ca = .*#ca = "ca-nobody.pem"#' "a CA file of user nobody, the gateway root" \
		"$tmp/owner.toml:5:6: [tls] ca file '$tmp/ca-nobody.pem' belongs to user nobody (uid $nobody), who could replace it, and the gateway runs as root: run the gateway as that user (runuser -u nobody -- gradgate ...), or run: chown root: '$tmp/ca-nobody.pem'"
	cp "$tmp/good.toml" "$tmp/nobodys.toml" && chown nobody "$tmp/nobodys.toml"
	"$gradgate" --check-config "$tmp/nobodys.toml" >/dev/null 2>"$tmp/err"
	expect "a config of user nobody, the gateway root, fails the check (exit 1)" $(( $? != 1 ))
	grep -qxF "$tmp/nobodys.toml: the config file belongs to user nobody (uid $nobody), who could replace it, and the gateway runs as root: run the gateway as that user (runuser -u nobody -- gradgate ...), or run: chown root: '$tmp/nobodys.toml'" "$tmp/err"
	rc=$?; expect "  saying whose it is and what to run: $(head -c 300 "$tmp/err")" $rc
	# localhost that resolves elsewhere (a hosts file of a mount
	# namespace of the test's own): the check refuses what the start would.
	if command -v unshare >/dev/null && unshare -m true 2>/dev/null; then
		printf '192.0.2.2 localhost\n' >"$tmp/hosts"
		sed "\$a [metrics]\nlisten = \"localhost:9464\"" "$tmp/good.toml" >"$tmp/metrics.toml"
		unshare -m sh -c 'mount --bind "$1" /etc/hosts && exec "$2" --check-config "$3"' sh "$tmp/hosts" "$gradgate" \
			"$tmp/metrics.toml" >/dev/null 2>"$tmp/err"
		expect "[metrics] listen on a localhost that is not loopback fails the check (exit 1)" $(( $? != 1 ))
		grep -qF "$tmp/metrics.toml:12:10: [metrics] listen localhost:9464 resolves to 192.0.2.2:9464, not a loopback address (set allow_remote = true to serve it there)" "$tmp/err"
		rc=$?; expect "  saying where it resolves: $(head -c 300 "$tmp/err")" $rc
	fi
	# A link of another user's on the way to the CA: it could point
	# anywhere, a bundle of other CAs of root's as well.
	ln -s "$tmp/ca.pem" "$tmp/ca-link.pem"
	chown -h nobody "$tmp/ca-link.pem"
	refused linked 's#^ca = .*#ca = "ca-link.pem"#' "a CA file reached by a link of user nobody's" \
		"$tmp/linked.toml:5:6: [tls] ca file '$tmp/ca-link.pem': link $tmp/ca-link.pem belongs to uid $nobody, not to root or the gateway's user (uid 0): its owner could put another file in its place, and so choose whom this gateway trusts"
	# A link of root's to the CA, but in a folder others may write in:
	# they could put another link there. And a link of root's that leads
	# to a link of another user's.
	mkdir -m 0755 "$tmp/safe" && cp "$tmp/ca.pem" "$tmp/safe/ca.pem"
	ln -s "$tmp/safe/ca.pem" "$tmp/open/ca-link.pem"
	refused openlink "s#^ca = .*#ca = \"open/ca-link.pem\"#" "a CA link in a folder others may write in" \
		"$tmp/openlink.toml:5:6: [tls] ca file '$tmp/open/ca-link.pem': folder $tmp/open (mode 0777) may be written by every user"
	ln -s "$tmp/ca-link.pem" "$tmp/ca-link2.pem"
	refused linklink 's#^ca = .*#ca = "ca-link2.pem"#' "a CA link of root's to a link of user nobody's" \
		"$tmp/linklink.toml:5:6: [tls] ca file '$tmp/ca-link2.pem': link $tmp/ca-link.pem belongs to uid $nobody"
	nb=$tmp/nb
	mkdir -m 0755 "$nb" "$nb/run"
	chmod 0711 "$tmp"
	cp "$tmp/ca.pem" "$tmp/cert.pem" "$tmp/key.pem" "$nb/"
	chown nobody "$nb/cert.pem" "$nb/key.pem"
	chown daemon "$nb/ca.pem"
	port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
	sed "s#^name = \"site-a\"#&\ncontrol = \"unix:$nb/run/gw/a.sock\"#; s#^listen = .*#listen = \"127.0.0.1:$port\"#" \
		"$tmp/good.toml" >"$nb/a.toml"
	runuser -u nobody -- "$gradgate" --check-config "$nb/a.toml" >/dev/null 2>"$tmp/err"
	grep -qF "$nb/a.toml:6:6: [tls] ca file '$nb/ca.pem' belongs to user daemon (uid $daemon), who could replace it, not to the gateway's user nobody (uid $nobody) or root; run: chown nobody: '$nb/ca.pem'" "$tmp/err"
	rc=$?; expect "a CA file of user daemon, the gateway nobody: $(head -c 300 "$tmp/err")" $rc
	chown nobody "$nb/ca.pem"
	made="control socket $nb/run/gw/a.sock: folder $nb/run/gw does not exist, and the gateway's user may not make it"
	runuser -u nobody -- "$gradgate" --check-config "$nb/a.toml" >/dev/null 2>"$tmp/err"
	expect "a socket folder the gateway's user cannot make fails the check (exit 1)" $(( $? != 1 ))
	grep -qF "$made (no write access to its parent folder); make it first: install -d -m 0755 -o nobody '$nb/run/gw'" "$tmp/err"
	rc=$?; expect "  saying how to make it: $(head -c 300 "$tmp/err")" $rc
	runuser -u nobody -- timeout 10 "$gradgate" --config "$nb/a.toml" >/dev/null 2>"$tmp/err"
	expect "the gateway does not start either (exit 3)" $(( $? != 3 ))
	grep -qF "$made (Permission denied)" "$tmp/err"; rc=$?; expect "  saying why: $(grep -o 'reason=.*' "$tmp/err" | head -c 300)" $rc
	install -d -m 0755 -o nobody "$nb/run/gw"
	runuser -u nobody -- "$gradgate" --check-config "$nb/a.toml" >/dev/null 2>"$tmp/err"
	rc=$?; expect "made as it says, the check passes: $(head -c 300 "$tmp/err")" $rc
	# A folder that is there, but that the gateway's user may not write in.
	sed "s#^control = .*#control = \"unix:$nb/run/b.sock\"#" "$nb/a.toml" >"$nb/ro.toml"
	runuser -u nobody -- "$gradgate" --check-config "$nb/ro.toml" >/dev/null 2>"$tmp/err"
	expect "a socket folder the gateway's user may not write in fails the check (exit 1)" $(( $? != 1 ))
	grep -qF "control socket $nb/run/b.sock: the gateway's user (nobody) may not make it in $nb/run (no write access): use a folder of its own, as /run/gradgate (install -d -m 0755 -o nobody /run/gradgate)" "$tmp/err"
	rc=$?; expect "  saying why: $(head -c 300 "$tmp/err")" $rc
	# The same for a folder to make in /.
	top=/gradgate-check-$$
	sed "s#^control = .*#control = \"unix:$top/a.sock\"#" "$nb/a.toml" >"$nb/top.toml"
	runuser -u nobody -- "$gradgate" --check-config "$nb/top.toml" >/dev/null 2>"$tmp/err"
	expect "a socket folder in / the gateway's user cannot make fails the check (exit 1)" $(( $? != 1 ))
	grep -qF "control socket $top/a.sock: folder $top does not exist, and the gateway's user may not make it (no write access to its parent folder); make it first: install -d -m 0755 -o nobody '$top'" "$tmp/err"
	rc=$?; expect "  saying how to make it: $(head -c 300 "$tmp/err")" $rc
	chmod 0700 "$tmp"
else
	echo "skip files of other users: not root, no users nobody and daemon, no runuser, or nobody may not run $gradgate"
fi

# The configs of several sites of one mesh are checked against each other
# too: what their gateways would refuse when they meet.
mkdir -p "$tmp/mesh"
for site in a b; do
	other=$([ $site = a ] && echo b || echo a)
	cat >"$tmp/mesh/$site.toml" <<TOML
[site]
name = "site-$site"
listen = "127.0.0.1:71$([ $site = a ] && echo 11 || echo 12)"
control = "unix:$tmp/mesh/$site.sock"
[tls]
ca = "../certs/ca.pem"
cert = "../certs/site-$site.pem"
key = "../certs/site-$site.key"
[[peers]]
site = "site-$other"
address = "127.0.0.1:71$([ $site = a ] && echo 12 || echo 11)"
identity = "dns:site-$other.gradgate.test"
TOML
done
chmod 600 "$tmp/mesh/"*.toml
"$gradgate" --check-config "$tmp/mesh/a.toml" "$tmp/mesh/b.toml" >/dev/null 2>"$tmp/err"
rc=$?; expect "two sites of one mesh that agree pass: $(head -c 300 "$tmp/err")" $rc
# cross NAME SED-ON-B WANT: b.toml changed so; the pair must fail, saying WANT.
cross() {
	sed "$2" "$tmp/mesh/b.toml" >"$tmp/mesh/b2.toml"
	chmod 600 "$tmp/mesh/b2.toml"
	"$gradgate" --check-config "$tmp/mesh/a.toml" "$tmp/mesh/b2.toml" >/dev/null 2>"$tmp/err"
	expect "$1: exits 1" $(( $? != 1 ))
	grep -qF -- "$3" "$tmp/err"
	rc=$?; expect "$1: says so: $(head -c 400 "$tmp/err")" $rc
	grep -qF "$tmp/mesh/a.toml and $tmp/mesh/b2.toml: 1 problem found between the two" "$tmp/err"
	expect "$1: counted" $?
}
cross "another codec" 's/^\[tls\]/[compression]\ncodec = "int8"\n[tls]/' \
	"$tmp/mesh/b2.toml: [compression] codec is int8, $tmp/mesh/a.toml's is bf16-split: the two sites refuse each other's streams"
cross "another chunk size" 's/^\[tls\]/[transport]\nchunk_size = "2MiB"\n[tls]/' \
	"$tmp/mesh/b2.toml: [transport] chunk_size is 2MiB, $tmp/mesh/a.toml's is 1MiB"
# Chunk sizes whose elements round to the same (as HELLO gives them) agree.
sed 's/^\[tls\]/[transport]\nchunk_size = 1048580\n[tls]/' "$tmp/mesh/b.toml" >"$tmp/mesh/b2.toml"
chmod 600 "$tmp/mesh/b2.toml"
"$gradgate" --check-config "$tmp/mesh/a.toml" "$tmp/mesh/b2.toml" >/dev/null 2>"$tmp/err"
rc=$?; expect "chunk sizes of the same elements agree: $(head -c 300 "$tmp/err")" $rc
for site in a b; do
	sed 's/^identity = .*/&\ndial = "in"/' "$tmp/mesh/$site.toml" >"$tmp/mesh/$site-in.toml"
	chmod 600 "$tmp/mesh/$site-in.toml"
done
"$gradgate" --check-config "$tmp/mesh/a-in.toml" "$tmp/mesh/b-in.toml" >/dev/null 2>"$tmp/err"
expect "both dial in: exits 1" $(( $? != 1 ))
la=$(grep -n '^dial = "in"' "$tmp/mesh/a-in.toml" | cut -d: -f1) lb=$(grep -n '^dial = "in"' "$tmp/mesh/b-in.toml" | cut -d: -f1)
grep -qF "$tmp/mesh/b-in.toml:$lb:8: dial = \"in\" for site site-a, as $tmp/mesh/a-in.toml's for site site-b ($tmp/mesh/a-in.toml:$la:8): neither dials" "$tmp/err"
rc=$?; expect "both dial in: says so: $(head -c 300 "$tmp/err")" $rc
cross "an identity the certificate lacks" 's/^identity = .*/identity = "dns:site-z.gradgate.test"/' \
	"$tmp/mesh/b2.toml: its [[peers]] identity for site site-a, dns:site-z.gradgate.test, is not in that site's certificate $tmp/mesh/../certs/site-a.pem ($tmp/mesh/a.toml): site site-b would refuse site site-a"
cross "another site known" 's/^\[\[peers\]\]/[[peers]]\nsite = "site-c"\naddress = "127.0.0.1:7113"\nidentity = "dns:site-c.gradgate.test"\n[[peers]]/' \
	"$tmp/mesh/b2.toml: knows the sites [site-a,site-b,site-c], $tmp/mesh/a.toml knows [site-a,site-b]: the two refuse each other's streams"
# Two configs of one site: two gateways that would take each other's streams.
cp -p "$tmp/mesh/a.toml" "$tmp/mesh/a2.toml"
"$gradgate" --check-config "$tmp/mesh/a.toml" "$tmp/mesh/a2.toml" >/dev/null 2>"$tmp/err"
expect "two configs of one site: exits 1" $(( $? != 1 ))
grep -qF "$tmp/mesh/a2.toml: site site-a, as $tmp/mesh/a.toml: two gateways of one site would take each other's streams" "$tmp/err"
rc=$?; expect "two configs of one site: says so: $(head -c 300 "$tmp/err")" $rc
# Other sites' files as they are on this host, the first file's: their
# keys, and their listen addresses, are another host's. They are checked
# for their settings and against the first; a certificate that cannot be
# read here is said to be left unchecked.
sed 's#^key = .*#key = "/nonexistent/site-b.key"#; s/^listen = .*/listen = "192.0.2.10:7112"/' \
	"$tmp/mesh/b.toml" >"$tmp/mesh/b-elsewhere.toml"
chmod 600 "$tmp/mesh/b-elsewhere.toml"
"$gradgate" --check-config "$tmp/mesh/a.toml" "$tmp/mesh/b-elsewhere.toml" >"$tmp/out" 2>"$tmp/err"
rc=$?; expect "another host's file, as copied here, passes: $(head -c 300 "$tmp/err")" $rc
grep -qF "# $tmp/mesh/b-elsewhere.toml: its settings (its files and host are checked on its own host)" "$tmp/out"
expect "another host's file is said to be checked for its settings" $?
sed -i 's#^cert = .*#cert = "/nonexistent/site-b.pem"#' "$tmp/mesh/b-elsewhere.toml"
"$gradgate" --check-config "$tmp/mesh/a.toml" "$tmp/mesh/b-elsewhere.toml" >"$tmp/out" 2>"$tmp/err"
rc=$?; expect "another host's file whose certificate is not here passes: $(head -c 300 "$tmp/err")" $rc
grep -qF "# $tmp/mesh/b-elsewhere.toml: its certificate /nonexistent/site-b.pem cannot be read here (No such file or directory): whether it names dns:site-b.gradgate.test, as $tmp/mesh/a.toml expects, is not checked" "$tmp/out"
expect "a certificate not here is said to be unchecked: $(grep -m1 'cannot be read here' "$tmp/out")" $?
# A pipe where the certificate would be is not read (it would hold the
# check up for good).
mkfifo "$tmp/mesh/fifo.pem"
sed -i "s#^cert = .*#cert = \"$tmp/mesh/fifo.pem\"#" "$tmp/mesh/b-elsewhere.toml"
timeout 10 "$gradgate" --check-config "$tmp/mesh/a.toml" "$tmp/mesh/b-elsewhere.toml" >"$tmp/out" 2>"$tmp/err"
rc=$?; expect "another host's file whose certificate is a pipe passes at once (status $rc)" $rc
grep -qF "its certificate $tmp/mesh/fifo.pem cannot be read here (not a regular file)" "$tmp/out"
expect "a pipe for a certificate is said to be unchecked" $?
# This host's own file still gets every check: given first, the file
# whose listen address is another host's is refused for it.
sed 's/^listen = .*/listen = "192.0.2.10:7112"/' "$tmp/mesh/b.toml" >"$tmp/mesh/b-listen.toml"
chmod 600 "$tmp/mesh/b-listen.toml"
"$gradgate" --check-config "$tmp/mesh/b-listen.toml" "$tmp/mesh/a.toml" >/dev/null 2>"$tmp/err"
expect "another host's file given first exits 1" $(( $? != 1 ))
grep -qF "192.0.2.10" "$tmp/err" && grep -q "interface of this host" "$tmp/err"
expect "another host's file given first: its listen address refused: $(head -c 300 "$tmp/err")" $?
sed -i 's/^identity = .*/&\ndial = "out"/' "$tmp/mesh/a.toml"
la=$(grep -n '^dial = "out"' "$tmp/mesh/a.toml" | cut -d: -f1) lb=$(grep -n '^identity = ' "$tmp/mesh/b.toml" | cut -d: -f1)
cross "both dial out" 's/^identity = .*/&\ndial = "out"/' \
	"$tmp/mesh/b2.toml:$((lb + 1)):8: dial = \"out\" for site site-a, as $tmp/mesh/a.toml's for site site-b ($tmp/mesh/a.toml:$la:8): each refuses the other's streams"

# --log-level LEVEL: a gateway logs only lines of LEVEL and above. Run
# until its control socket is there, then stopped: at warn and error, its
# peer's refused dials and its start and stop (info) are not logged.
# run_at LEVEL: the gateway's stderr in $tmp/run-LEVEL.err, its status.
run_at() {
	local sock="$tmp/run.sock" pid i port
	port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
	sed "s#^name = \"site-a\"#&\ncontrol = \"unix:$sock\"#; s#^listen = .*#listen = \"127.0.0.1:$port\"#; s#^address = .*#address = \"127.0.0.1:1\"#" \
		"$tmp/good.toml" >"$tmp/run.toml"
	chmod 600 "$tmp/run.toml"
	"$gradgate" --config "$tmp/run.toml" --log-level "$1" 2>"$tmp/run-$1.err" &
	pid=$!
	for ((i = 0; i < 100; i++)); do
		[ ! -S "$sock" ] || break
		sleep 0.05
	done
	[ -S "$sock" ] || echo "FAIL the gateway at --log-level $1 made no control socket within 5 s"
	[ -S "$sock" ] || fail=1
	sleep 0.3 # a few refused dials
	kill -TERM "$pid"
	wait "$pid"
}
run_at info
expect "a gateway at --log-level info stops with 0" $?
grep -q 'level=info event=started site=site-a' "$tmp/run-info.err" && grep -q 'level=info event=stopped' "$tmp/run-info.err"
expect "  and logs its start and stop at info" $?
for level in warn error; do
	run_at $level
	expect "a gateway at --log-level $level stops with 0" $?
	line=$(grep -m1 'level=\(debug\|info\)' "$tmp/run-$level.err")
	expect "  and logs no info or debug line: $line" $(( ${#line} != 0 ))
done

exit $fail
