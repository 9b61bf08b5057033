#!/usr/bin/env bash
# Fails when a file includes a header of a layer above its own (docs/ARCHITECTURE.md lists the layers).
set -u
cd "$(dirname "$0")/.."
rank() { case "$1" in base) echo 0;; gpu|device) echo 1;; bootstrap) echo 2;; transport|ras) echo 3;;
  core) echo 4;; api) echo 5;; *) echo -1;; esac; }
bad=0
for f in $(find src -name '*.[ch]' -o -name '*.cu' -o -name '*.cuh'); do
  from=$(echo "$f" | cut -d/ -f2); rf=$(rank "$from")
  for inc in $(grep -hoE '^#include "[^"]+"' "$f" | sed -E 's/^#include "//; s/"$//'); do
    to=$(echo "$inc" | cut -d/ -f1); rt=$(rank "$to")
    if [ "$rt" -gt "$rf" ]; then echo "layer violation: $f includes $inc"; bad=1; fi
    if [ "$from" != "$to" ] && [ "$rt" -ge 0 ] && [ "$from" = transport -o "$from" = ras ] && [ "$to" = transport -o "$to" = ras ]; then
      echo "layer violation: $f includes $inc (transport and ras are siblings)"; bad=1
    fi
  done
done
[ $bad = 0 ] && echo "layers: no upward includes"
exit $bad
