"""The evidence layers under the exact signatures: what a failure is when no signature knows it.

The exact signatures (signatures/*.yaml) name a failure by its wording. Real logs often carry a
known kind of failure in new words, or lose the line that says it. The layers, tried in order
only where the exact signatures found no root cause (analyze/root_cause.py):

  signature   an exact signature's anchor and regex matched (the database)
  anchor      the anchor is there but the line was cut at the end of the paste, or wrapped
              over two lines (scan.py retries the regex on the joined line; a cut last line
              counts when the regex matches it partially, i.e. up to its end)
  exception   an exception no signature knows, read by its type and message keywords
              (``by_exception`` in signatures/layers/exceptions.yaml)
  traceback   the frames and source lines of a traceback whose exception line is missing or
              unknown (``by_traceback`` in the same file)
  context     what the job was doing just before such a traceback (``by_context``: a
              "saving checkpoint" line a few lines above it)
  wrapper     a launcher or native failure line (Ray, Open MPI, a C++ assertion, a signal):
              signatures tagged ``wrapper``
  symptom     a metric over the log's structure (metric signatures)
  cascade     only consequences were found (NCCL watchdogs ...): the earliest is named
  failure     the job failed (a non-zero exit, a failed worker) and nothing says why

Each row of the tables names a ``scope: layer`` signature (signatures/generic.yaml) that gives
the category, cause and fix. The tables are data: a row is added where a class of failure is
missing, never code.
"""
from __future__ import annotations

from ..layer_tables import (  # noqa: F401 - the tables' names, read through this module too
    _TIMEOUT,
    BASES,
    LayerError,
    Row,
    Tables,
    check_against,
    load_tables,
)


def classify(tables: Tables, etype: str | None, message: str, frames: list, source: list,
             only: set | None = None) -> Row | None:
    """The first row that holds: the exception's type and message first, then its traceback.
    ``only``: signature ids the answer may name (a KeyboardInterrupt is read for a hang only)."""
    if etype:
        for row in tables.by_exception:
            if (only is None or row.signature in only) and row.holds(etype, message, frames, source):
                return row
    if frames:
        for row in tables.by_traceback:
            if (only is None or row.signature in only) and row.holds(etype, message, frames, source):
                return row
    return None


def classify_context(tables: Tables, file: str, start: int, activity: list) -> Row | None:
    """A by_context row whose activity line is in ``file`` at most ``within`` lines before
    ``start`` (the first line of the failure): the job failed while doing that."""
    for row in tables.by_context:
        for afile, aline, text in reversed(activity):
            if afile == file and 0 < start - aline <= row.within:
                try:
                    if row.before.search(text, timeout=_TIMEOUT):
                        return row
                except TimeoutError:
                    continue
    return None

