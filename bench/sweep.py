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
    ap.add_argument("--raw", action="store_true",
                    help="the matcher alone: every anchor occurrence counted, no line grouping (the ceiling of "
                         "any scan built on this engine)")
    a = ap.parse_args(argv)
    from diagnose.db import load
    from diagnose.logs.read import iter_sources, read_chunks
    from diagnose.scan import Scanner

    engine = Scanner(load(), a.engine).engine
    gc.disable()
    notes: list = []
    lines = size = 0
    t0 = time.perf_counter()
    hits = [0]

    def count(*_):
        hits[0] += 1

    for src in iter_sources([a.log], notes):
        for chunk in read_chunks(src, notes):
            if not a.raw:
                lines += len(engine.scan(chunk.data))
            elif getattr(engine, "db", None) is not None:  # hyperscan: the C scan and one call per match
                engine.db.scan(chunk.data, match_event_handler=count)
            else:
                hits[0] += sum(1 for _ in engine.find(chunk.data))
            size += len(chunk.data)
    dt = time.perf_counter() - t0
    if a.raw:
        print(f"{hits[0]} anchor occurrences; {size / dt / 1e6:.0f} MB/s ({engine.name}, matcher only)")
    else:
        print(f"{lines} lines hold an anchor; {size / dt / 1e6:.0f} MB/s ({engine.name})")
    for n in notes:
        print(f"sweep: {n}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
