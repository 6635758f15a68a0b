#!/usr/bin/env bash
# Makes a private CA and one certificate per site for gradgate's mutual TLS.
#
#   examples/make-certs.sh [--force] [--out DIR] [--domain DOMAIN] [--days N] [SITE...]
#   gradgate-make-certs ...  (the same, as `meson install` puts it)
#
#   --out DIR        where the files go (default: examples/certs in the
#                    source tree; ./certs for gradgate-make-certs)
#   --domain DOMAIN  the domain in each site's names (default gradgate.test)
#   --days N         how long the CA and certificates are valid, 1 to 999999
#                    days (default 825)
#   --force          make everything anew, even files that exist
#   -h, --help       print this text
#   SITE...          the sites (default site-a site-b site-c); a site name has
#                    1 to 63 of a-z, 0-9 and -, and neither starts nor ends
#                    with - (it is a DNS label of the certificate's name);
#                    not "ca", whose files are the CA's
#
# The CA is DIR/ca.pem and DIR/ca.key, named for when it was made ("gradgate
# demo CA 2026-12-05T10:00:00Z"), so a peer's certificate from another run
# of this script names an issuer the gateway's refusal tells apart from its
# own CA. Each site gets DIR/SITE.key, an ECDSA P-256 key (mode 0600), and
# DIR/SITE.pem, a certificate whose subjectAltName carries its identity
# twice, DNS:SITE.DOMAIN and URI:spiffe://DOMAIN/SITE, so a peer may name it
# either way in its config
# (identity = "dns:site-b.gradgate.test" or "uri:spiffe://gradgate.test/site-b").
# The certificates are for serverAuth and clientAuth: a gateway both accepts
# and opens connections. Existing files are kept unless --force is given;
# a key kept must be this user's alone (mode 600), or nothing is made (exit
# status 1): others may have read it. Every file made is a new one, never
# written into one that was there, whose owner and mode would stay. Every
# argument is checked before anything is made, DIR too (it must belong to
# this user or root and let nobody else write): a refused command (exit
# status 2) leaves no file behind.
set -euo pipefail

# Next to the script in the source tree (examples/), never next to the
# installed binaries.
if [ "$(basename "$(dirname "$0")")" = examples ]; then
	out="$(dirname "$0")/certs"
else
	out=certs
fi
me=$(basename "$0") # make-certs.sh, or the installed gradgate-make-certs
domain=gradgate.test
force=0
days=825
sites=()

# bad ARG RULE: refuses the command, before anything is made.
bad() {
	echo "$me: $1 $2" >&2
	exit 2
}

while [ $# -gt 0 ]; do
	case "$1" in
	--out|--domain|--days)
		[ $# -ge 2 ] || bad "$1" "needs a value (see --help)" ;;
	esac
	case "$1" in
	--force) force=1 ;;
	--out) out="$2"; shift ;;
	--domain) domain="$2"; shift ;;
	--days) days="$2"; shift ;;
	# The help is the header comment: every line from the second up to the
	# first one that is not a comment.
	-h|--help) awk 'NR == 1 { next } !/^#/ { exit } { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
	-*) echo "$me: unknown option '$1' (see --help)" >&2; exit 2 ;;
	*) sites+=("$1") ;;
	esac
	shift
done
[ ${#sites[@]} -gt 0 ] || sites=(site-a site-b site-c)

# Check every argument before making anything.
declare -A named=()
for site in "${sites[@]}"; do
	case "$site" in
	*[!a-z0-9-]*|""|-*|*-) bad "'$site'" "is not a site name (a-z, 0-9, -; not starting or ending with -)" ;;
	esac
	[ ${#site} -le 63 ] || bad "'$site'" "is not a site name (longer than 63 characters)"
	# Its files would be the CA's.
	[ "$site" != ca ] || bad "'$site'" "cannot be a site name here: its certificate and key would overwrite the CA's (ca.pem, ca.key)"
	[ -z "${named[$site]:-}" ] || bad "'$site'" "is named twice"
	named[$site]=1
done
if ! [[ $days =~ ^0*[1-9][0-9]{0,5}$ ]]; then
	bad "--days '$days'" "is not a number of days (a whole number from 1 to 999999)"
fi
days=$((10#$days)) # 007 is 7 (not octal) for openssl
# The domain is a DNS name, as the gateway reads identities: labels of 1 to 63
# letters, digits and -, not starting or ending with -, joined by dots.
label='[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?'
if [ ${#domain} -gt 253 ] || ! [[ $domain =~ ^$label(\.$label)*$ ]]; then
	bad "--domain '$domain'" "is not a domain (labels of 1 to 63 letters, digits and -, not starting or ending with -, joined by dots)"
fi
# Each certificate's name, SITE.DOMAIN, is a DNS name too: 253 characters at most.
for site in "${sites[@]}"; do
	[ $((${#site} + 1 + ${#domain})) -le 253 ] ||
		bad "'$site' with --domain '$domain'" "makes a DNS name of more than 253 characters ($site.$domain)"
done
[ -n "$out" ] || bad "--out ''" "is not a folder (an empty path)"
uid=$(id -u)
# check_out: --out, when it exists, is a folder this user may write in and
# nobody else may (they could read or replace the keys in it).
check_out() {
	local owner mode
	[ -e "$out" ] || [ -L "$out" ] || return 0
	[ -d "$out" ] || bad "--out '$out'" "is not a folder (it exists and is not a directory)"
	if ! [ -w "$out" ] || ! [ -x "$out" ]; then
		bad "--out '$out'" "is not a folder this user may write in"
	fi
	read -r owner mode < <(stat -L -c '%u %a' "$out")
	[ "$owner" = "$uid" ] || [ "$owner" = 0 ] ||
		bad "--out '$out'" "belongs to uid $owner, not to this user (uid $uid) or root: its owner could replace the keys in it"
	[ $((8#$mode & 8#022)) = 0 ] ||
		bad "--out '$out'" "may be written by others (mode $mode): they could replace the keys in it (chmod go-w)"
}
check_out
command -v openssl >/dev/null || { echo "$me: openssl is not installed" >&2; exit 1; }

# Folders made on the way (/etc/gradgate for /etc/gradgate/certs) are
# readable as any: the gateway's user reads its config there. The folder
# itself, which holds the CA key, and every key are the user's alone.
(umask 022 && mkdir -p "$(dirname "$out")")
umask 077
mkdir -p "$out"
check_out # again: another user may have made it meanwhile
tmp=$(mktemp -d)
trap 'rm -rf "$tmp" "$out"/.new.??????' EXIT

# new FILE MODE COMMAND...: runs COMMAND with its output file as the last
# argument, a new file of this user's (never an existing one, whose owner
# and mode would stay), and puts it in place of FILE with MODE.
new() {
	local file=$1 mode=$2 t
	shift 2
	t=$(mktemp "$out/.new.XXXXXX")
	"$@" "$t"
	chmod "$mode" "$t"
	mv -f "$t" "$file"
}

# kept FILE: a key kept as it is must be this user's alone.
kept() {
	local owner mode
	read -r owner mode < <(stat -L -c '%u %a' "$1")
	if [ "$owner" != "$uid" ] || [ $((8#$mode & 8#077)) != 0 ]; then
		echo "$me: $1 exists and is kept, but it belongs to uid $owner with mode $mode: a key must be this" \
			"user's alone (mode 600); others may have read it, so make it anew with --force" >&2
		exit 1
	fi
}

# The keys kept, checked before anything is made.
if [ $force = 0 ] && [ -f "$out/ca.pem" ] && [ -f "$out/ca.key" ]; then
	kept "$out/ca.key"
	for site in "${sites[@]}"; do
		if [ -f "$out/$site.pem" ] && [ -f "$out/$site.key" ]; then
			kept "$out/$site.key"
		fi
	done
fi

if [ $force = 1 ] || [ ! -f "$out/ca.pem" ] || [ ! -f "$out/ca.key" ]; then
	new "$out/ca.key" 600 openssl ecparam -name prime256v1 -genkey -noout -out
	new "$out/ca.pem" 644 openssl req -x509 -new -key "$out/ca.key" -sha256 -days "$days" \
		-subj "/O=gradgate/CN=gradgate demo CA $(date -u +%Y-%m-%dT%H:%M:%SZ)" \
		-addext "basicConstraints=critical,CA:TRUE,pathlen:0" \
		-addext "keyUsage=critical,keyCertSign,cRLSign" -out 2>/dev/null
	force=1 # a new CA invalidates every site certificate
	echo "made CA $out/ca.pem"
	# Certificates of sites not named here stay signed by the old CA.
	stale=()
	for pem in "$out"/*.pem; do
		name=$(basename "$pem" .pem)
		[ -f "$pem" ] && [ "$name" != ca ] && [[ " ${sites[*]} " != *" $name "* ]] && stale+=("$name")
	done
	if [ ${#stale[@]} -gt 0 ]; then
		echo "$me: warning: the new CA does not sign the existing certificates of ${stale[*]}:" \
			"peers will refuse them; make them again too (name every site)" >&2
	fi
fi

for site in "${sites[@]}"; do
	if [ $force = 0 ] && [ -f "$out/$site.pem" ] && [ -f "$out/$site.key" ]; then
		continue
	fi
	new "$out/$site.key" 600 openssl ecparam -name prime256v1 -genkey -noout -out
	cat > "$tmp/$site.ext" <<EXT
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth,clientAuth
subjectAltName=DNS:$site.$domain,URI:spiffe://$domain/$site
EXT
	openssl req -new -key "$out/$site.key" -subj "/O=gradgate/CN=$site" -out "$tmp/$site.csr"
	new "$out/$site.pem" 644 openssl x509 -req -in "$tmp/$site.csr" -CA "$out/ca.pem" -CAkey "$out/ca.key" \
		-CAcreateserial -CAserial "$tmp/ca.srl" -days "$days" -sha256 \
		-extfile "$tmp/$site.ext" -out 2>/dev/null
	echo "made $out/$site.pem (DNS:$site.$domain, URI:spiffe://$domain/$site)"
done
