#!/usr/bin/env bash
# Downloads the Debian packages that tests/gpu/run.sh unpacks on a GPU
# machine lacking the build dependencies (a CUDA image with no liburing,
# OpenSSL or zstd headers, pkg-config or openssl command): run it where apt
# works, carry the folder to the GPU machine, and pass it to run.sh --debs.
# Nothing is installed, here or there: run.sh unpacks them into its own
# folder.
#
#   tests/gpu/fetch-debs.sh [DIR]     (default: build-gpu-debs)
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=${1:-build-gpu-debs}
case "$dir" in -*)
	echo "usage: tests/gpu/fetch-debs.sh [DIR]   (default: build-gpu-debs)" >&2
	exit 2 ;;
esac
# The headers and link-time files, the libraries they name, pkg-config
# (pkgconf) and the openssl command the tests make certificates with.
pkgs=(liburing-dev liburing2 libssl-dev libssl3 libzstd-dev libzstd1 pkgconf pkgconf-bin libpkgconf3 openssl)
mkdir -p "$dir"
cd "$dir"
rm -f ./*.deb
apt-get download "${pkgs[@]}" || {
	echo "fetch-debs.sh: apt-get download failed (run 'apt-get update' first?)" >&2
	exit 1
}
echo "fetch-debs.sh: $(find . -maxdepth 1 -name '*.deb' | wc -l) packages, $(du -sh . | cut -f1), in $dir"
