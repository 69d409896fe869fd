#!/bin/bash
# With ATTNAUDIT_STATIC_CLI the attnaudit CLI must load no shared gRPC,
# protobuf, Abseil, OpenSSL or re2 library (their archives are linked in:
# cmake/link_static_deps.sh), and must still run. A regression here brings
# back ~5 ms of dynamic loading to every CLI start.
#
# Usage: static_cli_test.sh PATH/TO/attnaudit
set -euo pipefail
bin=$1
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
