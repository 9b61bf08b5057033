#!/usr/bin/env bash
# CI: builds and tests Braid on a root without the CUDA toolkit, as a user without one would: the host backend
# only, and a library that says at init that it has no kernels. The toolkit is hidden, not just unused: the
# script re-runs itself in a mount namespace of its own with an empty /usr/local (where CUDA and its headers
# are installed) and PATH without any CUDA folder, then checks that neither nvcc nor cuda.h can be found.
# Usage: .ci/nocuda.sh [BUILD_DIR] (default build-nocuda); CC picks the compiler (default clang).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-nocuda}

if [ "${BRAID_NOCUDA_INSIDE:-}" != 1 ]; then
  if ! unshare --mount --propagation private true 2>/dev/null; then
    echo "nocuda: cannot make a mount namespace (unshare needs root or CAP_SYS_ADMIN)" >&2
    exit 1
  fi
  exec unshare --mount --propagation private env BRAID_NOCUDA_INSIDE=1 bash "$0" "$@"
fi

case "$PWD" in /usr/local/*) echo "nocuda: the tree lies under /usr/local, which this hides" >&2; exit 1 ;; esac
[ -d /usr/local ] && mount -t tmpfs -o size=1m none /usr/local
for d in /opt/cuda /opt/nvidia; do [ -d "$d" ] && mount -t tmpfs -o size=1m none "$d"; done
PATH=$(echo "$PATH" | tr : '\n' | grep -v -i cuda | paste -sd:)
export PATH CC=${CC:-clang}
unset CUDA_PATH CUDA_HOME CUDAToolkit_ROOT
if command -v nvcc >/dev/null; then
  echo "nocuda: nvcc is still reachable at $(command -v nvcc)" >&2
  exit 1
fi
if echo '#include <cuda.h>' | "$CC" -E -x c - >/dev/null 2>&1; then
  echo "nocuda: cuda.h is still found by $CC" >&2
  exit 1
fi

rm -rf "$build"
cmake -S . -B "$build" -DBRAID_WERROR=ON >"$build.log"
grep -q "Braid: no CUDA compiler" "$build.log" || { cat "$build.log"; echo "nocuda: CMake found CUDA" >&2; exit 1; }
cmake --build "$build" -j"$(nproc)" >>"$build.log" 2>&1 || { tail -50 "$build.log"; exit 1; }
# The library without kernels: init on the host backend works, and `braid info` says why CUDA is not used.
"$build/bin/braid" info | grep -q "^Kernels: none" || { "$build/bin/braid" info; exit 1; }
ctest --test-dir "$build" -j"$(nproc)" --output-on-failure -L 'api|base|tools|device|install'
