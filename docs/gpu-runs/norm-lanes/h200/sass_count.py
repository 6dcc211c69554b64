"""Count, in SASS listings, the fmas that fuse a lane's own product into a cross-lane sum: an FFMA whose addend was
last written by a SHFL.BFLY. usage: python sass_count.py FILE..."""
import re, sys


def asymmetric(text):
    last = {}
    hits = 0
    n = 0
    for line in text.splitlines():
        m = re.search(r"/\*[0-9a-f]{4}\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)\s+([^;]*);", line)
        if not m:
            continue
        n += 1
        op, args = m.group(2), [a.strip() for a in m.group(3).split(",")]
        if op.startswith("FFMA") and len(args) == 4 and last.get(args[3].lstrip("-")) == "SHFL":
            hits += 1
        dest = args[1] if op.startswith("SHFL") and len(args) > 1 else (args[0] if args else "")
        if re.fullmatch(r"R\d+", dest):
            # a 64- or 128-bit result (a float64, a wide load or multiply, a matrix load of 2 or 4) writes the
            # registers after its first too
            width = 4 if (".128" in op or (op.startswith("LDSM") and op.endswith(".4"))) else \
                2 if (".64" in op or ".WIDE" in op or op[:4] in ("DADD", "DMUL", "DFMA")
                      or (op.startswith("LDSM") and op.endswith(".2"))) else 1
            for j in range(width):
                last[f"R{int(dest[1:]) + j}"] = "SHFL" if op.startswith("SHFL") else op
    return hits, n


for path in sys.argv[1:]:
    hits, n = asymmetric(open(path).read())
    print(f"{path.rsplit('/', 1)[-1][:60]}: {hits} fused cross-lane fmas, {n} instructions")
