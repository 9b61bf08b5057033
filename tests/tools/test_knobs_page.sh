#!/usr/bin/env bash
# The knob page cannot drift from the parameter registry: docs/knobs.md must be exactly what
# `braid info --params --markdown` prints, whatever the environment and configuration files hold; the page lists
# every knob; and every knob the README's table names exists. Run by ctest as: bash test_knobs_page.sh <build-dir>.
set -u
build=${1:?usage: test_knobs_page.sh <build-dir>}
braid="$build/bin/braid"
src=$(cd "$(dirname "$0")/../.." && pwd)
page="$src/docs/knobs.md"
regen="build/bin/braid info --params --markdown > docs/knobs.md"
failures=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

# Values in effect that differ from the defaults, from the environment and from a configuration file: the page
# shows defaults only, so none of them may show.
printf 'BRAID_STALL_WARN_S=7\nNCCL_DEBUG_SUBSYS=ALL\n' >"$tmp/nccl.conf"
HOME="$tmp" NCCL_CONF_FILE="$tmp/nccl.conf" BRAID_TIMEOUT_S=9 BRAID_DEVICE=host \
  "$braid" info --params --markdown >"$tmp/page.md" 2>"$tmp/err"
status=$?
[ "$status" -eq 0 ] || fail "braid info --params --markdown exited with status $status: $(cat "$tmp/err")"
[ -s "$tmp/err" ] && fail "braid info --params --markdown wrote to stderr: $(cat "$tmp/err")"

if [ ! -f "$page" ]; then
  fail "docs/knobs.md is missing; generate it from the repository root with: $regen"
elif ! diff -u "$page" "$tmp/page.md" >"$tmp/diff"; then
  fail "docs/knobs.md differs from the parameter registry; regenerate it from the repository root with: $regen"
  head -n 40 "$tmp/diff"
fi

# Every knob of the registry is a row of the page, once.
"$braid" info --params | awk 'NR > 1 {print $1}' >"$tmp/knobs"
[ -s "$tmp/knobs" ] || fail "braid info --params lists no knob"
while read -r knob; do
  rows=$(grep -c "^| \`$knob\` |" "$tmp/page.md")
  [ "$rows" -eq 1 ] || fail "$knob is on $rows rows of the generated page"
done <"$tmp/knobs"
[ "$(grep -c '^| `' "$tmp/page.md")" -eq "$(wc -l <"$tmp/knobs")" ] ||
  fail "the page has rows that are no knob of the registry"

# The README's knob table names only knobs that exist.
grep -o '^| `[A-Z][A-Z0-9_]*` |' "$src/README.md" | tr -d '|` ' >"$tmp/readme_knobs"
[ -s "$tmp/readme_knobs" ] || fail "README.md has no knob table rows"
while read -r knob; do
  grep -qx "$knob" "$tmp/knobs" || fail "README.md's knob table names $knob, which the registry does not have"
done <"$tmp/readme_knobs"

# --markdown belongs to --params.
"$braid" info --markdown >/dev/null 2>&1
[ $? -eq 2 ] || fail "braid info --markdown without --params was not refused"

if [ "$failures" -ne 0 ]; then
  echo "$failures failure(s)"
  exit 1
fi
echo "docs/knobs.md matches the registry ($(wc -l <"$tmp/knobs") knobs)"
