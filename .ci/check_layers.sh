#!/usr/bin/env bash
# Fails when the layering of docs/ARCHITECTURE.md does not hold:
#  - a file of src/, tools/ or tests/ includes a header of a layer above its own (base < device < gpu <
#    bootstrap < transport, ras < core < api < tools < tests; transport and ras are siblings); a header named
#    without a folder is the including file's folder's (or, in tests/, tests/common's);
#  - code above the transports names a transport's ops table instead of asking tp_select or tp_link;
#  - modules of src/ include each other in a circle (a module is a .c and its .h; a NAME_int.h shared by the
#    files of one module is NAME's).
set -u
cd "$(dirname "$0")/.."

rank() {
  case "$1" in
  base) echo 0 ;; device) echo 1 ;; gpu) echo 2 ;; bootstrap) echo 3 ;; transport | ras) echo 4 ;;
  core) echo 5 ;; api) echo 6 ;; tools) echo 7 ;; tests) echo 8 ;; *) echo -1 ;;
  esac
}

# The layer of a path (src/core/x.c -> core, tools/x.c -> tools, tests/... -> tests).
layer_of() {
  case "$1" in
  src/*) echo "$1" | cut -d/ -f2 ;;
  tools/*) echo tools ;;
  tests/*) echo tests ;;
  *) echo none ;;
  esac
}

# The repository path an include of `inc` from file `from` names, or "public" (include/), or "system".
resolve() {
  local from=$1 inc=$2 dir
  dir=$(dirname "$from")
  if [ -f "$dir/$inc" ]; then realpath -m --relative-to=. "$dir/$inc"; return; fi
  if [ -f "src/$inc" ]; then echo "src/$inc"; return; fi
  if [ -f "include/$inc" ]; then echo public; return; fi
  case "$from" in
  tests/*)
    for d in tests/common tools; do
      if [ -f "$d/$inc" ]; then echo "$d/$inc"; return; fi
    done
    ;;
  esac
  echo "unresolved:$inc"
}

# A module's name: its path without the extension, a NAME_int header counted as NAME's.
module_of() {
  local m=${1%.*}
  echo "${m%_int}"
}

bad=0
edges=$(mktemp)
trap 'rm -f "$edges"' EXIT
files=$(find src tools tests -name '*.[ch]' -o -name '*.cu' -o -name '*.cuh' | sort)
for f in $files; do
  from=$(layer_of "$f")
  rf=$(rank "$from")
  for inc in $(grep -hoE '^[[:space:]]*#[[:space:]]*include[[:space:]]+"[^"]+"' "$f" | sed -E 's/.*"([^"]+)"/\1/'); do
    target=$(resolve "$f" "$inc")
    case "$target" in
    public) continue ;;
    unresolved:*)
      echo "layers: $f includes \"$inc\", which is in no folder of the tree"
      bad=1
      continue
      ;;
    esac
    to=$(layer_of "$target")
    rt=$(rank "$to")
    if [ "$rt" -gt "$rf" ]; then
      echo "layer violation: $f ($from) includes $target ($to)"
      bad=1
    fi
    if [ "$from" != "$to" ] && { [ "$from" = transport ] || [ "$from" = ras ]; } &&
      { [ "$to" = transport ] || [ "$to" = ras ]; }; then
      echo "layer violation: $f includes $target (transport and ras are siblings)"
      bad=1
    fi
    a=$(module_of "$f")
    b=$(module_of "$target")
    case "$a $b" in src/*" "src/*) [ "$a" != "$b" ] && echo "$a $b" >>"$edges" ;; esac
  done
done

# Above the transports, a transport is reached through the selection (tp_select, tp_link), never by name.
named=$(grep -nE '\btp_(p2p|shm|net|gpu_shm|gpu_net)_ops\b' src/core/*.[ch] src/api/*.[ch] src/ras/*.[ch] 2>/dev/null)
if [ -n "$named" ]; then
  echo "layer violation: code above the transports names a transport's ops table:"
  echo "$named"
  bad=1
fi

# Circles between modules: a depth-first search over the include graph.
cycles=$(sort -u "$edges" | awk '
  { out[$1] = out[$1] " " $2; nodes[$1] = 1; nodes[$2] = 1 }
  function visit(n,    i, k, parts, m) {
    state[n] = 1; path[++depth] = n
    k = split(out[n], parts, " ")
    for (i = 1; i <= k; i++) {
      m = parts[i]
      if (state[m] == 1) {
        s = ""; for (j = depth; j >= 1; j--) { s = path[j] " -> " s; if (path[j] == m) break }
        print "circle: " s m
      } else if (state[m] == 0) visit(m)
    }
    depth--; state[n] = 2
  }
  END { for (n in nodes) if (state[n] == 0) visit(n) }')
if [ -n "$cycles" ]; then
  echo "layer violation: modules include each other in a circle"
  echo "$cycles"
  bad=1
fi

[ $bad = 0 ] && echo "layers: no upward includes, no transport named above its layer, no circles"
exit $bad
