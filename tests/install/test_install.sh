#!/usr/bin/env bash
# `cmake --install` into a temporary prefix, then the README's C example built against that prefix as a user
# would: with pkg-config, with find_package(Braid) (shared and static), and with find_package(NCCL) and the
# variables FindNCCL modules set. Each program must run on the installed library (its banner names Braid) and
# print the all-reduce's sums. Then the Debian packages cpack makes (where dpkg-deb is): their names and that
# every file lies under /opt/braid. Run by ctest as: bash test_install.sh <build-dir>.
set -u
build=${1:?usage: test_install.sh <build-dir>}
src=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prefix="$tmp/prefix"
failures=0
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

cmake --install "$build" --prefix "$prefix" >"$tmp/install.log" 2>&1 || { cat "$tmp/install.log"; exit 1; }
libdir=$(cd "$prefix" && ls -d lib*/libnccl.so.2 | xargs dirname)
for f in include/nccl.h "$libdir/libnccl.so.2.28.9" "$libdir/libnccl_static.a" "$libdir/pkgconfig/nccl.pc" \
  "$libdir/cmake/Braid/BraidConfig.cmake" "$libdir/cmake/NCCL/NCCLConfig.cmake" bin/braid share/doc/braid/LICENSE; do
  [ -f "$prefix/$f" ] || fail "not installed: $f"
done
[ "$(readlink "$prefix/$libdir/libnccl.so.2")" = libnccl.so.2.28.9 ] || fail "libnccl.so.2 is not a link to 2.28.9"
[ "$(readlink "$prefix/$libdir/libnccl.so")" = libnccl.so.2 ] || fail "libnccl.so is not a link to libnccl.so.2"
"$prefix/bin/braid" --version | grep -q '^braid ' || fail "the installed braid does not run"

# The README's example: the C block after the line "<!-- example: test_install.sh builds this -->".
awk '/<!-- example: test_install.sh builds this -->/ { on = 1; next } on && /^```c/ { code = 1; next }
  code && /^```/ { exit } code { print }' "$src/README.md" >"$tmp/example.c"
[ -s "$tmp/example.c" ] || { echo "no example in README.md"; exit 1; }

# run NAME PROGRAM [ENV...]: the program prints both ranks' sums (1+1, 2+2, 3+3, 4+5) and the banner of
# Braid's library, which NCCL_DEBUG=VERSION prints.
run() {
  local name=$1 prog=$2
  shift 2
  env NCCL_DEBUG=VERSION "$@" timeout 120 "$prog" >"$tmp/out" 2>&1 || { fail "$name: exit status $?"; cat "$tmp/out"; return; }
  [ "$(grep -c '^rank [01]: 2 4 6 9$' "$tmp/out")" -eq 2 ] || { fail "$name: wrong output"; cat "$tmp/out"; }
  grep -q '^NCCL version 2\.28\.9+braid\.' "$tmp/out" || { fail "$name: not Braid's library"; cat "$tmp/out"; }
}

# pkg-config, with the rpath the README shows.
export PKG_CONFIG_PATH="$prefix/$libdir/pkgconfig"
if command -v pkg-config >/dev/null; then
  [ "$(pkg-config --modversion nccl)" = 2.28.9 ] || fail "pkg-config --modversion: $(pkg-config --modversion nccl)"
  cc -o "$tmp/ex_pc" "$tmp/example.c" $(pkg-config --cflags --libs nccl) \
    -Wl,-rpath,"$(pkg-config --variable=libdir nccl)" || fail "pkg-config: the example does not build"
  [ -x "$tmp/ex_pc" ] && run pkg-config "$tmp/ex_pc"
else
  echo "no pkg-config: its build is not checked"
fi

# CMake: find_package(Braid) for the shared and the static library, find_package(NCCL) with its variables.
mkdir -p "$tmp/proj"
cp "$tmp/example.c" "$tmp/proj/"
cat >"$tmp/proj/CMakeLists.txt" <<'EOF'
cmake_minimum_required(VERSION 3.18)
project(example C)
find_package(Braid 0.1 REQUIRED)
add_executable(ex_braid example.c)
target_link_libraries(ex_braid PRIVATE Braid::nccl)
add_executable(ex_static example.c)
target_link_libraries(ex_static PRIVATE Braid::nccl_static)
find_package(NCCL 2.28 REQUIRED)
if(NOT NCCL_FOUND OR NOT NCCL_VERSION STREQUAL "2.28.9" OR NOT EXISTS "${NCCL_INCLUDE_DIRS}/nccl.h")
  message(FATAL_ERROR "find_package(NCCL): ${NCCL_VERSION} ${NCCL_INCLUDE_DIRS} ${NCCL_LIBRARIES}")
endif()
add_executable(ex_nccl example.c)
target_include_directories(ex_nccl PRIVATE ${NCCL_INCLUDE_DIRS})
target_link_libraries(ex_nccl PRIVATE ${NCCL_LIBRARIES})
add_executable(ex_nccl_target example.c)
target_link_libraries(ex_nccl_target PRIVATE NCCL::nccl)
EOF
if cmake -S "$tmp/proj" -B "$tmp/proj/build" -DCMAKE_PREFIX_PATH="$prefix" >"$tmp/cmake.log" 2>&1 &&
  cmake --build "$tmp/proj/build" >>"$tmp/cmake.log" 2>&1; then
  run "find_package(Braid)" "$tmp/proj/build/ex_braid"
  run "find_package(Braid), static" "$tmp/proj/build/ex_static"
  run "find_package(NCCL), variables" "$tmp/proj/build/ex_nccl" LD_LIBRARY_PATH="$prefix/$libdir"
  run "find_package(NCCL), target" "$tmp/proj/build/ex_nccl_target"
  ldd "$tmp/proj/build/ex_static" | grep -q libnccl && fail "the static build links libnccl.so"
else
  fail "CMake: the example does not configure or build"
  tail -n 30 "$tmp/cmake.log"
fi

# The Debian packages: by default "braid" and "braid-dev" under /opt/braid, beside NVIDIA's libnccl2.
if command -v dpkg-deb >/dev/null && [ -f "$build/CPackConfig.cmake" ]; then
  if cpack -G DEB -B "$tmp/deb" --config "$build/CPackConfig.cmake" >"$tmp/cpack.log" 2>&1; then
    for pkg in braid braid-dev; do
      deb=$(ls "$tmp"/deb/"$pkg"_*.deb 2>/dev/null | head -n 1)
      [ -n "$deb" ] || { fail "cpack made no $pkg package"; continue; }
      dpkg-deb -c "$deb" | awk '{ print $6 }' | grep -v '^\./opt/braid/' | grep -vx '\./\(opt/\)\?' &&
        fail "$pkg: files outside /opt/braid"
    done
    dpkg-deb -c "$tmp"/deb/braid_*.deb | grep -q ' \./opt/braid/lib/libnccl\.so\.2\.28\.9$' ||
      fail "braid: no /opt/braid/lib/libnccl.so.2.28.9"
    dpkg-deb -c "$tmp"/deb/braid-dev_*.deb | grep -q ' \./opt/braid/lib/libnccl_static\.a$' ||
      fail "braid-dev: no /opt/braid/lib/libnccl_static.a"
  else
    fail "cpack -G DEB failed"
    tail -n 20 "$tmp/cpack.log"
  fi
fi

if [ "$failures" -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "install checks passed ($prefix, $libdir)"
