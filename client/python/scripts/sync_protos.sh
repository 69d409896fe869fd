#!/usr/bin/env bash
# Refreshes client/python/proto/attnaudit/v1 from the repository's
# proto/attnaudit/v1: the copy that lets client/python (a copy of it, or its
# sdist) build outside the repository. A build inside the repository reads
# proto/ itself (setup.py); tests/python/test_stubs.py fails while the copy
# differs.
#
# usage: client/python/scripts/sync_protos.sh   (or: make py-protos)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)  # client/python
src="$here/../../proto/attnaudit/v1"
dst="$here/proto/attnaudit/v1"
mkdir -p "$dst"
rm -f "$dst"/*.proto
cp "$src"/*.proto "$dst/"
echo "sync_protos.sh: $(ls "$dst" | wc -l) .proto files in $dst"
