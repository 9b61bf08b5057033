#!/usr/bin/env python3
"""png_check.py FILE [MIN_WIDTH MIN_HEIGHT]: checks a PNG that `braid bench --png` wrote.

The signature, every chunk's CRC (zlib.crc32), the chunk order (IHDR first, PLTE before the IDAT chunks, which
come together, IEND last), IHDR (an 8-bit palette image of at least the given size), and the image data:
zlib.decompress of the IDAT chunks gives each row's filter byte (0) and its pixels, every one an index into
the palette. Exits 0, or 1 saying what is wrong.
"""
import struct
import sys
import zlib


def chunks(data):
    pos = 8
    while pos < len(data):
        if pos + 12 > len(data):
            raise ValueError(f"truncated chunk at byte {pos}")
        (n,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
        (crc,) = struct.unpack(">I", data[pos + 8 + n:pos + 12 + n])
        if len(body) != n or zlib.crc32(kind + body) != crc:
            raise ValueError(f"bad CRC or length in chunk {kind!r} at byte {pos}")
        yield kind.decode("latin-1"), body
        pos += 12 + n


def check(path, min_w, min_h):
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG signature")
    found = list(chunks(data))
    kinds = [k for k, _ in found]
    if kinds[0] != "IHDR" or kinds[-1] != "IEND" or kinds.count("IEND") != 1:
        raise ValueError(f"chunk order {kinds}")
    idats = [i for i, k in enumerate(kinds) if k == "IDAT"]
    if not idats or idats != list(range(idats[0], idats[-1] + 1)) or "PLTE" not in kinds[:idats[0]]:
        raise ValueError(f"chunk order {kinds}")
    w, h, depth, colour, comp, filt, interlace = struct.unpack(">IIBBBBB", found[0][1])
    if (depth, colour, comp, filt, interlace) != (8, 3, 0, 0, 0):
        raise ValueError(f"IHDR: depth {depth}, colour type {colour}: not the bench's 8-bit palette image")
    ncolours = len(dict(found)["PLTE"]) // 3
    raw = zlib.decompress(b"".join(body for k, body in found if k == "IDAT"))
    if len(raw) != h * (w + 1):
        raise ValueError(f"{len(raw)} bytes of image data for {w}x{h}")
    rows = [raw[y * (w + 1):(y + 1) * (w + 1)] for y in range(h)]
    if any(r[0] != 0 for r in rows) or max(max(r[1:]) for r in rows) >= ncolours:
        raise ValueError("a row's filter is not 0, or a pixel is not in the palette")
    ok = w >= min_w and h >= min_h
    print(f"png_check: {path}: {w}x{h}, colour type 3, {ncolours} colours, {len(idats)} IDAT, "
          f"{len(data)} bytes{'' if ok else ': too small'}")
    return ok


def main(argv):
    if len(argv) not in (2, 4):
        print("usage: png_check.py FILE [MIN_WIDTH MIN_HEIGHT]", file=sys.stderr)
        return 2
    try:
        ok = check(argv[1], *(int(a) for a in argv[2:4])) if len(argv) == 4 else check(argv[1], 1, 1)
    except (OSError, ValueError, zlib.error, struct.error) as e:
        print(f"png_check: {argv[1]}: {e}", file=sys.stderr)
        return 1
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
