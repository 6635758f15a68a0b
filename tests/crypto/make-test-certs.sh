#!/bin/sh
# Makes, in DIR, the certificates the TLS tests need: a test CA with valid
# site certificates, and the ones a gateway must refuse. Every key is
# ECDSA P-256, mode 0600. Names (NAME.pem + NAME.key):
#   ca            the trusted test CA (ca.pem; crl.pem is its CRL)
#   site-a, site-b, site-c   valid, SAN DNS:site-X.gradgate.test
#   site-a-uri    valid, SAN URI:spiffe://gradgate/site-a
#   site-b-renewed  valid, same SAN as site-b, CN "site-b renewed"
#   cn-site-a     CN=site-a.gradgate.test but SAN DNS:site-c.gradgate.test
#   expired-a     site-a, valid only in January 2020
#   noclient-a    site-a, extendedKeyUsage serverAuth only
#   revoked-a     site-a, listed in crl.pem
#   int-ca, int-revoked-ca   intermediate CAs under ca, which revokes
#                 int-revoked-ca in crl.pem; crl-chain.pem holds crl.pem
#                 and the CRLs of both intermediates
#   int-a, int-revoked-a     site-a, issued by int-ca and int-revoked-ca
#   foreign-ca.crl  a CRL of the foreign CA only
#   foreign-a     site-a, issued by another CA (foreign-ca.pem)
#   forged-a      a SAN DNS name holding a newline, a forged log line, an
#                 ESC sequence and quotes (what a log must never pass raw)
# Usage: make-test-certs.sh DIR   (OPENSSL names the openssl binary)
set -eu
dir=$1
openssl=${OPENSSL:-openssl}
mkdir -p "$dir"
cd "$dir"
dir=$(pwd)
umask 077

key() {
	"$openssl" genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1.key" 2>/dev/null
}

# make_ca NAME SUBJECT_CN [PARENT]: a root CA, or an intermediate one
# issued by PARENT.
make_ca() {
	mkdir -p "$1.db"
	: >"$1.db/index.txt"
	echo 1000 >"$1.db/serial"
	key "$1"
	if [ $# -lt 3 ]; then
		"$openssl" req -x509 -new -key "$1.key" -subj "/CN=$2" -days 30 -out "$1.pem" \
			-addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign
	else
		"$openssl" req -new -key "$1.key" -subj "/CN=$2" -out "$1.csr"
		printf 'basicConstraints=critical,CA:TRUE,pathlen:0\nkeyUsage=critical,keyCertSign,cRLSign\n' >"$1.ext"
		[ -z "${SAN:-}" ] || printf 'subjectAltName=%s\n' "$SAN" >>"$1.ext"
		"$openssl" ca -batch -notext -config "$3.cnf" -in "$1.csr" -out "$1.pem" -extfile "$1.ext" 2>/dev/null
		rm -f "$1.csr" "$1.ext"
	fi
	cat >"$1.cnf" <<EOF
[ca]
default_ca = this
[this]
database = $dir/$1.db/index.txt
serial = $dir/$1.db/serial
crlnumber = $dir/$1.db/crlnumber
new_certs_dir = $dir/$1.db
certificate = $dir/$1.pem
private_key = $dir/$1.key
default_md = sha256
default_days = 30
default_crl_days = 30
policy = any
unique_subject = no
[any]
commonName = supplied
EOF
	echo 01 >"$1.db/crlnumber"
}

# leaf CA NAME CN SAN EKU [openssl ca options]
leaf() {
	ca=$1 name=$2 cn=$3 san=$4 eku=$5
	shift 5
	key "$name"
	"$openssl" req -new -key "$name.key" -subj "/CN=$cn" -out "$name.csr"
	printf 'basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=%s\nsubjectAltName=%s\n' \
		"$eku" "$san" >"$name.ext"
	"$openssl" ca -batch -notext -config "$ca.cnf" -in "$name.csr" -out "$name.pem" -extfile "$name.ext" "$@" 2>/dev/null
	rm -f "$name.csr" "$name.ext"
}

both=serverAuth,clientAuth
make_ca ca "gradgate test CA"
make_ca foreign-ca "foreign CA"
leaf ca site-a site-a.gradgate.test DNS:site-a.gradgate.test $both
leaf ca site-b site-b.gradgate.test DNS:site-b.gradgate.test $both
leaf ca site-c site-c.gradgate.test DNS:site-c.gradgate.test $both
leaf ca site-a-uri site-a URI:spiffe://gradgate/site-a $both
leaf ca site-b-renewed "site-b renewed" DNS:site-b.gradgate.test $both
leaf ca cn-site-a site-a.gradgate.test DNS:site-c.gradgate.test $both
leaf ca expired-a site-a.gradgate.test DNS:site-a.gradgate.test $both -startdate 20200101000000Z -enddate 20200201000000Z
leaf ca noclient-a site-a.gradgate.test DNS:site-a.gradgate.test serverAuth
leaf ca revoked-a site-a.gradgate.test DNS:site-a.gradgate.test $both
leaf foreign-ca foreign-a site-a.gradgate.test DNS:site-a.gradgate.test $both
# The forged name as DER: SEQUENCE { [2] IA5String } (lengths below 128).
printf 'x\nts=2026-01-01T00:00:00.000Z level=error event=forged\033[31m"quoted"' >forged.bin
len=$(wc -c <forged.bin)
der=$(printf '30%02x82%02x' $((len + 2)) "$len")$(od -An -tx1 forged.bin | tr -d ' \n')
rm -f forged.bin
leaf ca forged-a site-a.gradgate.test "DER:$der" $both
make_ca int-ca "gradgate test intermediate CA" ca
make_ca int-revoked-ca "gradgate revoked intermediate CA" ca
leaf int-ca int-a site-a.gradgate.test DNS:site-a.gradgate.test $both
leaf int-revoked-ca int-revoked-a site-a.gradgate.test DNS:site-a.gradgate.test $both
# A site's certificate made a CA's (it names site-b), and one it issued
# that names site-a: it chains to ca.
SAN=DNS:site-b.gradgate.test make_ca site-b-ca "site-b as a CA" ca
leaf site-b-ca via-b-a site-a.gradgate.test DNS:site-a.gradgate.test $both
"$openssl" ca -batch -config ca.cnf -revoke revoked-a.pem 2>/dev/null
"$openssl" ca -batch -config ca.cnf -revoke int-revoked-ca.pem 2>/dev/null
"$openssl" ca -batch -config ca.cnf -gencrl -out crl.pem 2>/dev/null
for ca in int-ca int-revoked-ca; do
	"$openssl" ca -batch -config $ca.cnf -gencrl -out $ca.crl 2>/dev/null
done
cat crl.pem int-ca.crl int-revoked-ca.crl >crl-chain.pem
"$openssl" ca -batch -config foreign-ca.cnf -gencrl -out foreign-ca.crl 2>/dev/null
