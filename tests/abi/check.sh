#!/usr/bin/env bash
# libgradgate's ABI and install tree:
#   check.sh SRC BUILD LIBGRADGATE_SO VERSION PREFIX LIBDIR BINDIR SYSCONFDIR CC...
# 1. the shared library exports exactly the GRADGATE_API functions of
#    include/gradgate.h, versioned GRADGATE_0, under soname
#    libgradgate.so.MAJOR;
# 2. `meson install --destdir` puts the header, both libraries, the
#    pkg-config file, the binaries, the systemd unit (paths filled in),
#    the example configs and the Python package where they belong (where a
#    python3 of the host reads it), and the installed package loads the
#    installed library;
# 3. a program built with `pkg-config --cflags --libs gradgate` against
#    that tree links libgradgate.so, and reports its version; one that
#    calls an internal function does not link.
set -euo pipefail
src=$1 build=$2 so=$3 version=$4 prefix=$5 libdir=$6 bindir=$7 sysconfdir=$8
shift 8
cc=("$@")
fail=0
bad() { echo "FAIL: $*"; fail=1; }
for tool in nm readelf pkg-config; do
	command -v "$tool" >/dev/null || { echo "SKIP: no $tool"; exit 77; }
done
work=$(mktemp -d "${TMPDIR:-/tmp}/gg-abi.XXXXXX")
trap 'rm -rf "$work"' EXIT

# 1. Exports.
grep -o '^GRADGATE_API [^(]*(' "$src/include/gradgate.h" | sed -E 's/.*[ *]([a-z_0-9]+)\($/\1/' | sort >"$work/api"
[ -s "$work/api" ] || bad "no GRADGATE_API functions found in include/gradgate.h"
nm -D --defined-only "$so" | awk '{ print $3 }' | grep -v '^GRADGATE_0$' | sort >"$work/exports.versioned"
sed 's/@@GRADGATE_0$//' "$work/exports.versioned" >"$work/exports"
if ! diff -u "$work/api" "$work/exports" >"$work/diff"; then
	bad "libgradgate.so exports differ from include/gradgate.h's GRADGATE_API functions:"
	cat "$work/diff"
fi
if grep -v '@@GRADGATE_0$' "$work/exports.versioned" >/dev/null; then
	bad "symbols outside version GRADGATE_0: $(grep -v '@@GRADGATE_0$' "$work/exports.versioned" | tr '\n' ' ')"
fi
soname=$(readelf -d "$so" | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')
[ "$soname" = "libgradgate.so.${version%%.*}" ] || bad "soname is '$soname', not libgradgate.so.${version%%.*}"
echo "exports: $(wc -l <"$work/exports") functions, soname $soname"

# 2. The install tree.
dest=$work/dest
meson install -C "$build" --destdir "$dest" --no-rebuild --quiet >"$work/install.log" 2>&1 ||
	{ cat "$work/install.log"; bad "meson install failed"; exit 1; }
root=$dest$prefix
for f in include/gradgate.h "$libdir/libgradgate.a" "$libdir/libgradgate.so" "$libdir/libgradgate.so.${version%%.*}" \
	"$libdir/libgradgate.so.$version" "$libdir/pkgconfig/gradgate.pc" "$bindir/gradgate" "$bindir/gradgate-bench" \
	"$bindir/gradgate-make-certs" lib/systemd/system/gradgate.service share/doc/gradgate/examples/site-a.toml \
	libexec/gradgate/linkem share/gradgate/wan_gloo.py; do
	[ -e "$root/$f" ] || bad "meson install did not put $prefix/$f"
done
unit=$root/lib/systemd/system/gradgate.service
if [ -e "$unit" ]; then
	grep -q '@[A-Z]*@' "$unit" && bad "the installed unit has unfilled @...@ paths"
	case $sysconfdir in /*) etc=$sysconfdir ;; *) etc=$prefix/$sysconfdir ;; esac
	grep -qx "ExecStart=$prefix/$bindir/gradgate --config $etc/gradgate/site.toml" "$unit" ||
		bad "the installed unit does not start $prefix/$bindir/gradgate with $etc/gradgate/site.toml"
fi
pkg=$(find "$root" -path '*/gradgate/__init__.py' -path '*-packages/*' | head -1)
if [ -z "$pkg" ]; then
	bad "meson install did not put the Python package gradgate in a site-packages folder"
elif [[ " ${cc[*]} " != *" -fsanitize="* ]] && command -v python3 >/dev/null; then
	# The installed package finds the installed library by its soname (not
	# in sanitizer builds: Python cannot load a library that expects the
	# sanitizer's runtime in the executable).
	got=$(cd "$work" && env -u GRADGATE_LIBRARY PYTHONPATH="$(dirname "$(dirname "$pkg")")" \
		LD_LIBRARY_PATH="$root/$libdir" python3 -c 'import gradgate; print(gradgate.version())' 2>&1) ||
		true
	[ "$got" = "$version" ] || bad "the installed Python package reports '$got', not version $version"
fi
# Where a python3 on this host reads packages under the prefix (Debian's
# does for /usr/local and /usr), the package is in one such folder, even
# with one of its own (pyenv) first on PATH: no PYTHONPATH once installed.
if [ -n "$pkg" ]; then
	folder=$(dirname "$(dirname "${pkg#"$dest"}")") readers= any=
	for py in python3 /usr/bin/python3; do
		command -v "$py" >/dev/null || continue
		sites=$("$py" -c 'import site; print("\n".join(site.getsitepackages()))' 2>/dev/null) || continue
		grep -q "^$prefix/" <<<"$sites" && any=1
		grep -qx -- "$folder" <<<"$sites" && readers+=" $py"
	done
	[ -z "$any" ] || [ -n "$readers" ] ||
		bad "the Python package went to $folder, which no python3 here reads (python3, /usr/bin/python3)"
	echo "python package: $folder, read by:${readers:- none}"
fi
for b in gradgate gradgate-make-certs; do
	[ -x "$root/$bindir/$b" ] || bad "$bindir/$b is not executable"
done

# 3. A program built against the installed tree with pkg-config.
cat >"$work/prog.c" <<'PROG'
#include <gradgate.h>
#include <stdio.h>
#include <string.h>
int main(void)
{
	struct gg_session *s = NULL;
	struct gg_error err;
	int rc = gg_session_open("unix:/nonexistent/gradgate.sock", "abi", 0, 1, &s, &err);
	printf("%s|%d|%s|%zu\n", gg_version(), rc == err.code && !s, gg_strerror(GG_ERR_TIMEOUT), gg_dtype_size(GG_DTYPE_BF16));
	return 0;
}
PROG
export PKG_CONFIG_SYSROOT_DIR=$dest PKG_CONFIG_LIBDIR=$root/$libdir/pkgconfig
read -r -a flags < <(pkg-config --cflags --libs gradgate)
[ "$(pkg-config --modversion gradgate)" = "$version" ] || bad "pkg-config --modversion is not $version"
if "${cc[@]}" -o "$work/prog" "$work/prog.c" "${flags[@]}" 2>"$work/cc.log"; then
	out=$(LD_LIBRARY_PATH=$root/$libdir "$work/prog")
	want="$version|1|deadline passed|2"
	[ "$out" = "$want" ] || bad "the program printed '$out', expected '$want'"
	ldd_out=$(LD_LIBRARY_PATH=$root/$libdir ldd "$work/prog" | grep libgradgate || true)
	case $ldd_out in *"$root/$libdir/libgradgate.so.${version%%.*}"*) ;;
	*) bad "the program does not load the installed libgradgate.so: $ldd_out" ;; esac
else
	cat "$work/cc.log"
	bad "a program using the public API does not build with pkg-config's flags"
fi
# The header stands alone, warning-free, in every C from C89 and, where a
# C++ compiler is found, in C++98 and later.
printf '#include <gradgate.h>\n' >"$work/header.c"
read -r -a cflags < <(pkg-config --cflags gradgate)
for std in c89 c99 c11 c17; do
	"${cc[@]}" -std=$std -pedantic -Wall -Wextra -Werror -fsyntax-only "${cflags[@]}" "$work/header.c" \
		2>"$work/header.log" || { cat "$work/header.log"; bad "gradgate.h does not build as $std, -pedantic"; }
done
if command -v c++ >/dev/null; then
	cp "$work/header.c" "$work/header.cpp"
	for std in c++98 c++11 c++17; do
		c++ -std=$std -pedantic -Wall -Wextra -Werror -fsyntax-only "${cflags[@]}" \
			"$work/header.cpp" 2>"$work/header.log" ||
			{ cat "$work/header.log"; bad "gradgate.h does not build as $std, -pedantic"; }
	done
fi
# Internal functions are not part of the shared library's ABI.
printf '#include <stddef.h>\nconst char *gg_ctrl_type_name(unsigned type);\nint main(void) { return gg_ctrl_type_name(1) != NULL; }\n' >"$work/internal.c"
if "${cc[@]}" -o "$work/internal" "$work/internal.c" "${flags[@]}" 2>"$work/cc2.log"; then
	bad "a program calling internal gg_ctrl_type_name links against libgradgate.so"
elif ! grep -q "undefined reference to .gg_ctrl_type_name" "$work/cc2.log"; then
	cat "$work/cc2.log"
	bad "linking the internal function failed, but not for the undefined symbol"
fi
[ "$fail" = 0 ] && echo "abi-install: ok"
exit "$fail"
