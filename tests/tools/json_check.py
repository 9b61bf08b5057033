#!/usr/bin/env python3
"""Checks the JSON files `braid bench` writes.

json_check.py FILE NLIBS NRANKS COLLECTIVE...: a sweep (--json). The file must be strict JSON (no NaN or
Infinity, no duplicate keys), then hold what the bench promises: the tool's name, the run's mode with NRANKS
ranks, NLIBS libraries, and results whose every row has its names, sizes, per-library arrays of NLIBS
figures, no wrong values, ratios exactly when there are two libraries, a floor time (a positive number)
exactly when the mode says "floor", and at least one row of each COLLECTIVE named.

json_check.py --resources FILE NLIBS NRANKS DEVICE [WHAT=A[,B]...]: a `braid bench --resources` file: kind
"resources", NRANKS ranks on DEVICE (cuda or host), NLIBS libraries that each completed, and every figure,
in order, once, with one value per library: memory and the floor null on the host and numbers on cuda, times
positive, the time per iteration at least the host time of the iteration's calls, and each ratio B/A where
it is defined (null otherwise). Each WHAT=A[,B] asserts a figure's values (within 0.05; '*' for any).

Exits 0, or 1 saying what is wrong.
"""
import json
import math
import sys

RES_WHATS = ["mem_before_init_mib", "init_ms", "mem_after_init_mib", "mem_bench_mib", "first_all_reduce_ms",
             "mem_after_all_mib", "mem_increase_mib", "enqueue_us", "iteration_us", "floor_launch_us",
             "mem_end_mib"]
problems = []


def bad(where, what):
    problems.append(f"{where}: {what}")


def is_num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def need(obj, key, kind, where):
    """obj[key], which must exist and be of `kind` (a type or a tuple of them); None otherwise."""
    v = obj.get(key) if isinstance(obj, dict) else None
    ok = is_num(v) if kind == "num" else isinstance(v, kind) and not (kind is int and isinstance(v, bool))
    if not ok:
        bad(where, f'"{key}" {"missing" if v is None else "has the wrong type"}')
        return None
    return v


def strict_load(path):
    def no_constant(name):
        raise ValueError(f"{name} is not JSON")

    def no_duplicates(pairs):
        keys = [k for k, _ in pairs]
        if len(keys) != len(set(keys)):
            raise ValueError("duplicate key")
        return dict(pairs)

    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f, parse_constant=no_constant, object_pairs_hook=no_duplicates)
    except (OSError, ValueError) as e:
        sys.exit(f"json_check: {path}: not JSON: {e}")


def check_per_lib(row, key, nlibs, nulls, where):
    a = need(row, key, list, where)
    if a is None:
        return
    if len(a) != nlibs:
        bad(where, key)
    for x in a:
        if not ((is_num(x) and x >= 0) or (nulls and x is None)):
            bad(where, key)


def check_row(row, nlibs, floor):
    coll = need(row, "collective", str, "result")
    where = f"result {coll or '?'}"
    need(row, "type", str, where)
    need(row, "op", str, where)
    need(row, "root", "num", where)
    if need(row, "place", str, where) not in ("out", "in", None):
        bad(where, "place")
    nbytes, batch = need(row, "bytes", "num", where), need(row, "batch", "num", where)
    need(row, "count", "num", where)
    if (nbytes is not None and nbytes < 0) or (batch is not None and batch < 1):
        bad(where, "bytes or batch")
    for key, nulls in (("time_us", False), ("algbw", True), ("busbw", True), ("wrong", False)):
        check_per_lib(row, key, nlibs, nulls, where)
    if any(is_num(w) and w != 0 for w in row.get("wrong") or []):
        bad(where, "wrong values")
    for key in ("time_ratio", "busbw_ratio"):
        r = row.get(key, "missing")
        if not (r is None or (nlibs > 1 and is_num(r))):
            bad(where, key)
    f = row.get("floor_us", "missing")
    if not ((is_num(f) and f > 0) if floor else f is None):
        bad(where, "floor_us")


def check_header(root, nlibs, nranks, sweep):
    if need(root, "tool", str, "top") not in ("braid bench", None):
        bad("top", 'tool is not "braid bench"')
    need(root, "date", str, "top")
    need(root, "gpu", str, "top")
    if sweep:
        mode = need(root, "mode", dict, "top") or {}
        if need(mode, "nranks", "num", "mode") not in (nranks, None):
            bad("mode", "nranks")
        need(mode, "device", str, "mode")
        need(mode, "layout", str, "mode")
        need(mode, "samples", "num", "mode")
        need(mode, "floor", bool, "mode")
    libs = need(root, "libraries", list, "top") or []
    if len(libs) != nlibs:
        bad("libraries", "wrong count")
    for i, lib in enumerate(libs):
        if need(lib, "name", str, "library") not in (chr(ord("A") + i), None):
            bad("library", "name")
        need(lib, "path", str, "library")
        need(lib, "version", "num", "library")


def figure(figs, what, lib):
    for fig in figs:
        vals = fig.get("values")
        if fig.get("what") == what and isinstance(vals, list) and lib < len(vals) and is_num(vals[lib]):
            return vals[lib]
    return math.nan


def check_figure(fig, what, nlibs, host):
    if need(fig, "what", str, what) not in (what, None):
        bad(what, "figure out of order or misnamed")
    vals = need(fig, "values", list, what) or []
    if len(vals) != nlibs:
        bad(what, "not one value per library")
    memory, floor = what.endswith("_mib"), what == "floor_launch_us"
    for v in vals:
        if (memory or floor) and host:
            if v is not None:
                bad(what, "memory or the floor on the host is not null")
        elif not is_num(v) or v < 0 or (not memory and v <= 0):
            bad(what, "memory is not a number >= 0" if memory else "time is not a positive number")
    # The ratio B/A where both are numbers, A's positive, and the figure is the library's own.
    own = what not in ("mem_before_init_mib", "mem_bench_mib") and not floor
    defined = own and nlibs > 1 and len(vals) == nlibs and is_num(vals[0]) and vals[0] > 0 and is_num(vals[1])
    r = fig.get("ratio", "missing")
    if defined and not is_num(r):
        bad(what, "ratio is not a number")
    elif not defined and r is not None:
        bad(what, "ratio is not null")
    elif defined and abs(r - vals[1] / vals[0]) > 1e-3 * abs(vals[1] / vals[0]) + 1e-9:
        bad(what, "ratio is not B/A")


def check_assertion(figs, arg, nlibs):
    what, eq, wanted = arg.partition("=")
    if not eq:
        bad(arg, "not WHAT=A[,B]")
        return
    for lib, want in enumerate(wanted.split(",")[:nlibs]):
        got = figure(figs, what, lib)
        if want != "*" and not abs(got - float(want)) <= 0.05:
            bad(what, f"library {chr(ord('A') + lib)}: {got}, expected {want}")


def check_resources(root, nlibs, nranks, device, asserts):
    if need(root, "kind", str, "top") not in ("resources", None):
        bad("top", 'kind is not "resources"')
    if need(root, "device", str, "top") not in (device, None):
        bad("top", "device")
    if need(root, "nranks", "num", "top") not in (nranks, None):
        bad("top", "nranks")
    need(root, "buffer_bytes", "num", "top")
    need(root, "iterations", "num", "top")
    for lib in root.get("libraries") or []:
        if need(lib, "complete", bool, "library") is False:
            bad("library", "did not complete")
    figs = need(root, "figures", list, "top") or []
    if len(figs) != len(RES_WHATS):
        bad("figures", "not every figure, or more")
    for fig, what in zip(figs, RES_WHATS):
        check_figure(fig, what, nlibs, device == "host")
    # An iteration is nranks calls and the wait for them: never less than their host time.
    for lib in range(nlibs):
        if not figure(figs, "iteration_us", lib) >= figure(figs, "enqueue_us", lib) * nranks * (1 - 1e-4):
            bad("iteration_us", "less than nranks calls' host time")
    for arg in asserts:
        check_assertion(figs, arg, nlibs)


def report(path, what):
    for p in problems[:20]:
        print(f"json_check: {p}", file=sys.stderr)
    print(f"json_check: {path}: {what}, {len(problems)} problem(s)")
    return 1 if problems else 0


def main(argv):
    if len(argv) >= 6 and argv[1] == "--resources":
        root = strict_load(argv[2])
        nlibs, nranks = int(argv[3]), int(argv[4])
        check_header(root, nlibs, nranks, False)
        check_resources(root, nlibs, nranks, argv[5], argv[6:])
        return report(argv[2], "resources")
    if len(argv) < 5:
        print("usage: json_check.py FILE NLIBS NRANKS COLLECTIVE...\n"
              "       json_check.py --resources FILE NLIBS NRANKS cuda|host [WHAT=A[,B]...]", file=sys.stderr)
        return 2
    root = strict_load(argv[1])
    nlibs, nranks = int(argv[2]), int(argv[3])
    check_header(root, nlibs, nranks, True)
    results = need(root, "results", list, "top") or []
    floor = (root.get("mode") or {}).get("floor") is True
    for row in results:
        check_row(row, nlibs, floor)
    for coll in argv[4:]:
        if not any(row.get("collective") == coll for row in results):
            bad(coll, "no result rows")
    return report(argv[1], f"{len(results)} result rows")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
