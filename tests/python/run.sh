#!/usr/bin/env bash
# Runs a Python test or example against this build:
#   run.sh SRC GRADGATE LIBGRADGATE_SO SCRIPT [ARGS...]
# with the first Python 3 that has numpy and torch (Debian's
# python3-numpy and python3-torch), the source tree's python/ on the path,
# and the build's gateway, client library and certificate script. Exits 77
# (skipped) when no such Python is installed.
set -euo pipefail
src=$1 gradgate=$2 lib=$3 script=$4
shift 4
py=
for cand in /usr/bin/python3 python3; do
	if command -v "$cand" >/dev/null && "$cand" -c 'import numpy, torch' 2>/dev/null; then
		py=$cand
		break
	fi
done
[ -n "$py" ] || { echo "SKIP: no python3 with numpy and torch (apt-get install python3-torch)"; exit 77; }
export PYTHONPATH=$src/python${PYTHONPATH:+:$PYTHONPATH}
export GRADGATE=$gradgate GRADGATE_LIBRARY=$lib GRADGATE_MAKE_CERTS=$src/examples/make-certs.sh
exec "$py" "$script" "$@"
