#!/usr/bin/env bash
# Makes a private CA and one certificate per site for gradgate's mutual TLS.
#
#   examples/make-certs.sh [--force] [--out DIR] [--domain DOMAIN] [SITE...]
#
# Defaults: --out examples/certs, --domain gradgate.test, sites site-a site-b
# site-c. Each site gets an ECDSA P-256 key (mode 0600) and a certificate
# whose subjectAltName carries its identity twice, DNS:SITE.DOMAIN and
# URI:spiffe://DOMAIN/SITE, so a peer may name it either way in its config
# (identity = "dns:site-b.gradgate.test" or "uri:spiffe://gradgate.test/site-b").
# The certificates are for serverAuth and clientAuth: a gateway both accepts
# and opens connections. Existing files are kept unless --force is given.
set -euo pipefail

out="$(dirname "$0")/certs"
domain=gradgate.test
force=0
days=825
sites=()

while [ $# -gt 0 ]; do
	case "$1" in
	--force) force=1 ;;
	--out) out="$2"; shift ;;
	--domain) domain="$2"; shift ;;
	--days) days="$2"; shift ;;
	-h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	-*) echo "make-certs.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
	*) sites+=("$1") ;;
	esac
	shift
done
[ ${#sites[@]} -gt 0 ] || sites=(site-a site-b site-c)
command -v openssl >/dev/null || { echo "make-certs.sh: openssl is not installed" >&2; exit 1; }

umask 077
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

if [ $force = 1 ] || [ ! -f "$out/ca.pem" ] || [ ! -f "$out/ca.key" ]; then
	openssl ecparam -name prime256v1 -genkey -noout -out "$out/ca.key"
	openssl req -x509 -new -key "$out/ca.key" -sha256 -days "$days" \
		-subj "/O=gradgate/CN=gradgate demo CA" \
		-addext "basicConstraints=critical,CA:TRUE,pathlen:0" \
		-addext "keyUsage=critical,keyCertSign,cRLSign" \
		-out "$out/ca.pem" 2>/dev/null
	chmod 644 "$out/ca.pem"
	force=1 # a new CA invalidates every site certificate
	echo "made CA $out/ca.pem"
fi

for site in "${sites[@]}"; do
	case "$site" in
	*[!a-z0-9-]*|"") echo "make-certs.sh: '$site' is not a site name (a-z, 0-9, -)" >&2; exit 2 ;;
	esac
	if [ $force = 0 ] && [ -f "$out/$site.pem" ] && [ -f "$out/$site.key" ]; then
		continue
	fi
	openssl ecparam -name prime256v1 -genkey -noout -out "$out/$site.key"
	cat > "$tmp/$site.ext" <<EXT
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth,clientAuth
subjectAltName=DNS:$site.$domain,URI:spiffe://$domain/$site
EXT
	openssl req -new -key "$out/$site.key" -subj "/O=gradgate/CN=$site" -out "$tmp/$site.csr"
	openssl x509 -req -in "$tmp/$site.csr" -CA "$out/ca.pem" -CAkey "$out/ca.key" \
		-CAcreateserial -CAserial "$tmp/ca.srl" -days "$days" -sha256 \
		-extfile "$tmp/$site.ext" -out "$out/$site.pem" 2>/dev/null
	chmod 600 "$out/$site.key"
	chmod 644 "$out/$site.pem"
	echo "made $out/$site.pem (DNS:$site.$domain, URI:spiffe://$domain/$site)"
done
