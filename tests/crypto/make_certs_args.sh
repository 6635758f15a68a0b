#!/usr/bin/env bash
# make_certs_args.sh MAKE_CERTS: examples/make-certs.sh checks every
# argument before it makes anything, so a refused command (exit 2) leaves
# no folder, and an earlier CA untouched even with --force; --help is the
# usage text alone and names every option. Keys are new files of mode 600,
# a kept one others may read is refused, and so is a folder others may
# write in.
set -u
mc=$1 work=$(mktemp -d) bad=0
trap 'rm -rf "$work"' EXIT
"$mc" --help | grep -q -- '--days' || { echo "--help lacks --days"; bad=1; }
"$mc" --help | grep -q 'set -euo' && { echo "--help prints script lines"; bad=1; }
long=$(printf 'a%.0s' {1..64}) # one past a site name's 63 characters
label=${long:1}                # 63 characters
domain=$label.$label.$label.${label:5} # 250 characters: with "site-a." the name has 257
for args in "Bad_Name" "site-a Bad_Name" "site-a site-b site-a" "site-a $long" "site-a -x" "site-a x-" "site-x ca" "--days 0" "--days 000" "--days x" \
	"--domain a,b" "--days" "--domain $domain site-a"; do
	# shellcheck disable=SC2086
	"$mc" --out "$work/new" $args 2>/dev/null; rc=$?
	[ $rc = 2 ] || { echo "'$args': exit $rc, not 2"; bad=1; }
	[ ! -e "$work/new" ] || { echo "'$args' left $(ls -A "$work/new")"; bad=1; rm -rf "$work/new"; }
done
# Leading zeros are decimal: 08 is 8 days, not an octal error.
"$mc" --out "$work/days" --days 08 site-a >/dev/null || { echo "--days 08 refused"; bad=1; }
if [ -e "$work/days/site-a.pem" ]; then
	end=$(date -d "$(openssl x509 -in "$work/days/site-a.pem" -noout -enddate | cut -d= -f2)" +%s)
	[ $(((end - $(date +%s) + 3600) / 86400)) = 8 ] || { echo "--days 08 did not give 8 days"; bad=1; }
fi
"$mc" --out "$work/old" site-a >/dev/null || exit 1
before=$(cd "$work/old" && sha256sum ./*)
"$mc" --force --out "$work/old" Bad_Name 2>/dev/null && { echo "Bad_Name accepted"; bad=1; }
[ "$(cd "$work/old" && sha256sum ./*)" = "$before" ] || { echo "a refused --force run touched the earlier CA"; bad=1; }
# The folders it makes above its own stay readable: the gateway's user
# reads its config there.
"$mc" --out "$work/etc/gradgate/certs" site-a >/dev/null || exit 1
[ "$(stat -c %a "$work/etc/gradgate")" = 755 ] ||
	{ echo "make-certs made $work/etc/gradgate mode $(stat -c %a "$work/etc/gradgate")"; bad=1; }
[ "$(stat -c %a "$work/etc/gradgate/certs")" = 700 ] || { echo "the certificates' folder is not 0700"; bad=1; }
[ "$(stat -c %a "$work/etc/gradgate/certs/site-a.key")" = 600 ] || { echo "a key is not 0600"; bad=1; }
# A new CA for some sites says which others it leaves behind.
"$mc" --out "$work/old" site-b >/dev/null || exit 1
warn=$("$mc" --force --out "$work/old" site-a 2>&1 >/dev/null)
[[ $warn == *"does not sign the existing certificates of site-b"* ]] ||
	{ echo "a new CA for site-a did not name site-b's certificate: '$warn'"; bad=1; }
warn=$("$mc" --force --out "$work/old" site-a site-b 2>&1 >/dev/null)
[ -z "$warn" ] || { echo "a new CA for every site warned: '$warn'"; bad=1; }
# Keys are new files of this user's, mode 600: never written into a file
# that was there, whose mode and owner would stay.
mkdir "$work/loose"
touch "$work/loose/ca.key" "$work/loose/site-a.key"
chmod 644 "$work/loose/ca.key" "$work/loose/site-a.key"
"$mc" --force --out "$work/loose" site-a >/dev/null || { echo "--force over loose keys failed"; bad=1; }
for k in ca site-a; do
	[ "$(stat -c '%u %a' "$work/loose/$k.key")" = "$(id -u) 600" ] ||
		{ echo "$k.key written into the file that was there: $(stat -c '%u %a' "$work/loose/$k.key")"; bad=1; }
done
[ -z "$(find "$work/loose" -name '.new.*')" ] || { echo "make-certs left temporary files"; bad=1; }
# A key kept (no --force) that others may read is refused, saying so.
chmod 644 "$work/loose/ca.key"
err=$("$mc" --out "$work/loose" site-a 2>&1 >/dev/null); rc=$?
[ $rc = 1 ] && [[ $err == *"loose/ca.key exists and is kept, but it belongs to uid $(id -u) with mode 644"* ]] ||
	{ echo "a kept CA key of mode 644 was not refused (exit $rc): '$err'"; bad=1; }
chmod 600 "$work/loose/ca.key"
chmod 640 "$work/loose/site-a.key"
err=$("$mc" --out "$work/loose" site-b site-a 2>&1 >/dev/null); rc=$?
[ $rc = 1 ] && [[ $err == *"loose/site-a.key exists and is kept"* ]] && [ ! -e "$work/loose/site-b.key" ] ||
	{ echo "a kept site key of mode 640 was not refused before site-b's was made (exit $rc): '$err'"; bad=1; }
# A folder others may write in, or another user's, is refused before
# anything is made.
mkdir -m 777 "$work/shared"
chmod 777 "$work/shared" # past the umask
err=$("$mc" --out "$work/shared" site-a 2>&1 >/dev/null); rc=$?
[ $rc = 2 ] && [[ $err == *"may be written by others (mode 777)"* ]] && [ -z "$(ls -A "$work/shared")" ] ||
	{ echo "a folder of mode 777 was not refused (exit $rc): '$err'"; bad=1; }
if [ "$(id -u)" = 0 ] && id nobody >/dev/null 2>&1; then
	mkdir -m 700 "$work/theirs"
	chown nobody "$work/theirs"
	err=$("$mc" --out "$work/theirs" site-a 2>&1 >/dev/null); rc=$?
	[ $rc = 2 ] && [[ $err == *"belongs to uid $(id -u nobody), not to this user (uid 0) or root"* ]] &&
		[ -z "$(ls -A "$work/theirs")" ] || { echo "another user's folder was not refused (exit $rc): '$err'"; bad=1; }
fi
# The installed copy (gradgate-make-certs) makes ./certs, never a folder
# next to the binaries.
mkdir "$work/bin" "$work/cwd"
cp "$mc" "$work/bin/gradgate-make-certs"
(cd "$work/cwd" && "$work/bin/gradgate-make-certs" site-a >/dev/null) || { echo "gradgate-make-certs failed"; bad=1; }
[ -f "$work/cwd/certs/site-a.pem" ] && [ ! -e "$work/bin/certs" ] ||
	{ echo "gradgate-make-certs without --out did not make ./certs"; bad=1; }
exit $bad
