#!/bin/bash
# Link launcher (CMake's RULE_LAUNCH_LINK) for executables that should
# start fast: runs the link command it is given with every system shared
# library that has a static archive beside it (gRPC, protobuf, Abseil,
# OpenSSL, re2, c-ares, zlib) replaced by that archive, so the dynamic
# loader no longer maps and relocates ~50 libraries at every start
# (docs/PERF.md, "The process's fixed cost"). The C and C++ runtimes, libm
# and oneTBB (which has no archive in Debian) stay shared. Archives are
# order-sensitive, so the libraries are linked as one group. All or
# nothing: if any of those libraries lacks an archive, the command runs
# unchanged (a static Abseil beside a shared gRPC that loads its own shared
# Abseil would put two copies of Abseil's globals in one process).
#
# Usage: link_static_deps.sh COMPILER ARGS...   (as CMake invokes it)
set -euo pipefail

# Runtimes (C, C++, compiler support, oneTBB) that stay shared even where
# an archive exists.
keep_shared='^(c|m|dl|rt|pthread|atomic|gomp|stdc\+\+|gcc_s|gcc|tbb|tbbmalloc)$'

static_for() {  # the archive beside a shared library path, or nothing
  local path=$1
  [[ $path =~ ^(/usr)?/lib/.*/lib([A-Za-z0-9_+.-]+)\.so(\.[0-9.]+)?$ ]] ||
    return 1
  local name=${BASH_REMATCH[2]}
  [[ $name =~ $keep_shared ]] && return 1
  local archive
  archive="$(dirname "$path")/lib${name}.a"
  [[ -f $archive ]] && echo "$archive"
}

static_for_flag() {  # the archive of a -lNAME flag, or nothing
  local name=${1#-l}
  [[ $name =~ $keep_shared ]] && return 1
  local dir
  for dir in /usr/lib/x86_64-linux-gnu /usr/lib/aarch64-linux-gnu /usr/lib; do
    if [[ -f $dir/lib${name}.a ]]; then
      echo "$dir/lib${name}.a"
      return 0
    fi
  done
  return 1
}

is_system_shared() {  # a shared library the launcher would replace
  local arg=$1 name
  if [[ $arg =~ ^(/usr)?/lib/.*/lib([A-Za-z0-9_+.-]+)\.so(\.[0-9.]+)?$ ]]; then
    name=${BASH_REMATCH[2]}
  elif [[ $arg == -l* ]]; then
    name=${arg#-l}
  else
    return 1
  fi
  [[ ! $name =~ $keep_shared ]]
}

args=()
grouped=0
for arg in "$@"; do
  replacement=""
  if [[ $arg == /* && $arg == *.so* ]]; then
    replacement=$(static_for "$arg") || replacement=""
  elif [[ $arg == -l* ]]; then
    replacement=$(static_for_flag "$arg") || replacement=""
  fi
  if [[ -z $replacement ]] && is_system_shared "$arg"; then
    echo "link_static_deps.sh: no static archive for $arg; linking" \
      "every library shared" >&2
    exec "$@"
  fi
  if [[ -n $replacement ]]; then
    if [[ $grouped == 0 ]]; then
      args+=("-Wl,--start-group")
      grouped=1
    fi
    args+=("$replacement")
  else
    args+=("$arg")
  fi
done
if [[ $grouped == 1 ]]; then
  # Static OpenSSL and gRPC need these from the C library at the end.
  args+=("-Wl,--end-group" "-ldl" "-lpthread")
fi
exec "${args[@]}"
