#!/usr/bin/env bash
# The library exports exactly the host functions of NCCL 2.30.7 (tests/api/nccl-2.30.7-exports.txt): none
# missing (a program built against NCCL's header, PyTorch's libtorch_cuda.so among them, would fail to load)
# and none extra. Every ncclX that has a pncclX twin must be weak, so that a profiler can interpose it.
set -u
build=${1:?usage: test_exports.sh BUILD_DIR}
lib=$build/lib/libnccl.so.2
list=$(dirname "$0")/nccl-2.30.7-exports.txt
status=0

if ! command -v nm >/dev/null; then echo "nm (binutils) is missing"; echo "0 passed, 1 failed"; exit 1; fi
symbols=$(nm -D --defined-only "$lib" | awk '$2 != "A" {print $2, $3}')
have=$(echo "$symbols" | awk '{print $2}' | sort -u)
want=$(grep -v '^#' "$list" | sort -u)

missing=$(comm -13 <(echo "$have") <(echo "$want"))
extra=$(comm -23 <(echo "$have") <(echo "$want"))
if [ -n "$missing" ]; then echo "missing from $lib:"; echo "$missing" | sed 's/^/  /'; status=1; fi
if [ -n "$extra" ]; then echo "exported by $lib but not by NCCL 2.30.7:"; echo "$extra" | sed 's/^/  /'; status=1; fi

# ncclX weak wherever pncclX exists
strong=$(echo "$symbols" | awk '{type[$2] = $1} END {for (s in type) if (s ~ /^nccl/ && ("p" s) in type && type[s] != "W") print s}')
if [ -n "$strong" ]; then echo "not weak (cannot be interposed):"; echo "$strong" | sed 's/^/  /'; status=1; fi

echo "$(echo "$want" | wc -l) symbols expected, $(echo "$have" | wc -l) exported"
[ $status = 0 ] && echo "1 passed, 0 failed" || echo "0 passed, 1 failed"
exit $status
