#!/usr/bin/env bash
# Makes certificates for sites s0..s7 and runs an in-process mesh test.
set -eu
make_certs=$1 test=$2
shift 2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$make_certs" --out "$dir" s0 s1 s2 s3 s4 s5 s6 s7 >/dev/null
"$test" "$dir" "$@"
