#!/bin/bash
# With ATTNAUDIT_STATIC_CLI the attnaudit CLI must load no shared gRPC,
# protobuf, Abseil, OpenSSL or re2 library (their archives are linked in:
# cmake/link_static_deps.sh), and must still run. A regression here brings
# back ~5 ms of dynamic loading to every CLI start.
#
# The launcher itself (cmake/link_static_deps.sh) is checked on echo: it
# swaps in the archives it finds, and links everything shared as soon as
# one system library has no archive.
#
# Usage: static_cli_test.sh PATH/TO/attnaudit PATH/TO/link_static_deps.sh
set -euo pipefail
bin=$1
launcher=$2
libdir=$(dirname "$(readlink -f /usr/lib/*/libz.so | head -n 1)")
swapped=$(bash "$launcher" echo a.o "$libdir/libz.so" -lm 2>/dev/null)
[[ $swapped == *"$libdir/libz.a"* && $swapped == *"-lm"* ]] ||
  { echo "FAIL: the launcher did not swap libz.so: $swapped"; exit 1; }
unchanged=$(bash "$launcher" echo a.o "$libdir/libz.so" \
  "$libdir/libno_such_library.so.1" 2>/dev/null)
[[ $unchanged == "a.o $libdir/libz.so $libdir/libno_such_library.so.1" ]] ||
  { echo "FAIL: a missing archive did not leave the command as it was: $unchanged"; exit 1; }
deps=$(ldd "$bin")
shared=$(grep -E 'lib(grpc|gpr|upb|protobuf|absl_|ssl|crypto|re2|cares)' \
  <<<"$deps" || true)
if [[ -n $shared ]]; then
  echo "FAIL: $bin still loads these shared libraries:"
  echo "$shared"
  exit 1
fi
# The runtimes stay shared: a fully static binary would lose oneTBB.
grep -q 'libtbb' <<<"$deps" || { echo "FAIL: no libtbb in ldd"; exit 1; }
version=$("$bin" --version)
[[ $version == attnaudit* ]] || { echo "FAIL: --version said: $version"; exit 1; }
echo "ok: $(wc -l <<<"$deps") shared objects; $version"
