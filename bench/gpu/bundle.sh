#!/usr/bin/env bash
# Packs what bench/gpu/device-check.sh runs -- the GPU tests, the GPU
# benchmark, the server and the CLI of a CUDA build -- with the shared
# libraries they load, for a GPU machine that has a driver but not the
# build's Debian packages (a lent machine that cannot install anything).
# There, `PREBUILT=TARBALL bench/gpu/device-check.sh` unpacks and runs
# them instead of building.
#
# Build the binaries portable, for the machine's GPU:
#   cmake -S . -B build-sm90 -DCMAKE_BUILD_TYPE=Release \
#     -DATTNAUDIT_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
#     -DATTNAUDIT_NATIVE_ARCH=OFF
# (-march=native would tie the CPU code to this machine's ISA.)
# glibc, the CUDA driver (libcuda) and NCCL (190 MB; device-check.sh looks
# for the target's, e.g. the nvidia-nccl wheel PyTorch brings) stay behind;
# glibc is backward compatible, so the target's must be as new as the
# build machine's. Everything else an ldd lists (libstdc++, absl, gRPC,
# protobuf, oneTBB, the CUDA runtime...) is copied, and the whole is one
# xz tarball (bin/, lib/, commit.txt).
# usage: bench/gpu/bundle.sh BUILD_DIR TARBALL
set -euo pipefail

BUILD=${1:?usage: bundle.sh BUILD_DIR TARBALL}
TARBALL=${2:?usage: bundle.sh BUILD_DIR TARBALL}
DEST=$(mktemp -d)
trap 'rm -rf "$DEST"' EXIT
BINARIES=(cuda_backend_test cuda_transports_test kernel_math_test
  device_pool_test attnaudit_bench_gpu attnaudit-server attnaudit)

mkdir -p "$DEST/bin" "$DEST/lib"
for name in "${BINARIES[@]}"; do
  path=$(find "$BUILD" -type f -name "$name" -perm -u+x | head -1)
  [[ -n "$path" ]] || { echo "bundle: $name not built in $BUILD" >&2; exit 1; }
  strip -o "$DEST/bin/$name" "$path"
done
# The target's loader and C library, and the driver, are not copied.
keep_behind='^(ld-linux|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|libcuda\.so|libnccl\.so)'
for bin in "$DEST"/bin/*; do
  ldd "$bin" | awk '/=> \// {print $3}'
done | sort -u | while read -r lib; do
  base=$(basename "$lib")
  [[ "$base" =~ $keep_behind ]] && continue
  cp -L "$lib" "$DEST/lib/$base"
done
strip --strip-unneeded "$DEST"/lib/* 2>/dev/null || true
git -C "$(dirname "$0")" log -1 --format='%H %s' >"$DEST/commit.txt"
tar -C "$DEST" -cJf "$TARBALL" bin lib commit.txt
du -h "$TARBALL"
