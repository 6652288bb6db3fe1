"""The anchor sweep alone, what ``rg -c -f`` does: count the lines that hold an anchor.

    python bench/sweep.py LOG [--engine hyperscan|regex]

Reads LOG (a file or a folder) with diagnose's own reader (8 MB chunks of whole lines) and runs
the engine's ``scan`` over every chunk, without the per-line work of a diagnosis (prefixes,
regexes, structure, root cause). bench/run.py times it next to rg and grep: it is the like-for-
like comparison, while ``diagnose LOG`` is the whole job.
"""
from __future__ import annotations

import argparse
import gc
import sys
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("log")
    ap.add_argument("--engine", default=None)
    a = ap.parse_args(argv)
    from diagnose.db import load
    from diagnose.logs.read import iter_sources, read_chunks
    from diagnose.scan import Scanner

    engine = Scanner(load(), a.engine).engine
    gc.disable()
    notes: list = []
    lines = size = 0
    t0 = time.perf_counter()
    for src in iter_sources([a.log], notes):
        for chunk in read_chunks(src, notes):
            lines += len(engine.scan(chunk.data))
            size += len(chunk.data)
    dt = time.perf_counter() - t0
    print(f"{lines} lines hold an anchor; {size / dt / 1e6:.0f} MB/s ({engine.name})")
    for n in notes:
        print(f"sweep: {n}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
