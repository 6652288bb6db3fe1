"""The scan's progress bar on stderr: bytes, MB/s, time left.

Shown only when stderr is a terminal (never in pipes, CI logs or with ``--quiet``) and only
once a scan has run for ``DELAY`` seconds, so quick scans print nothing. It is fed through the
``progress(nbytes)`` callback of ``Scanner.scan_paths`` / ``diagnose_paths``.
"""
from __future__ import annotations

import os
import sys
import time
from typing import Any

DELAY = 1.0  # seconds before the bar appears


def total_size(paths) -> int | None:
    """Bytes to read (None when unknown: stdin, or a compressed input that will grow on reading)."""
    from .logs.read import iter_sources

    total = 0
    for src in iter_sources(paths, []):
        if src.path is None:
            return None
        try:
            with open(src.path, "rb") as fh:
                if fh.read(2) == b"\x1f\x8b":
                    return None
            total += os.stat(src.path).st_size
        except OSError:
            continue
    return total


class ScanProgress:
    """A callable ``progress(nbytes)``; a context manager that clears the bar when done."""

    def __init__(self, total: int | None, stream=None, delay: float = DELAY, enabled: bool | None = None):
        """``enabled``: None = when ``stream`` is a terminal; True forces it (tests), False never."""
        self.stream = stream or sys.stderr
        self.enabled = bool(getattr(self.stream, "isatty", lambda: False)()) if enabled is None else enabled
        self.total = total
        self.delay = delay
        self.t0 = time.monotonic()
        self.done = 0
        self.bar: Any = None  # rich's Progress, once shown
        self.task: Any = None

    def __call__(self, nbytes: int):
        self.done += nbytes
        if not self.enabled:
            return
        if self.bar is None:
            if time.monotonic() - self.t0 < self.delay:
                return
            self._start()
        total = self.total if self.total is not None and self.done <= self.total else None
        self.bar.update(self.task, completed=self.done, total=total)

    def _start(self):
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        console = Console(file=self.stream, force_terminal=True)
        self.bar = Progress(TextColumn("[bold]scanning"), BarColumn(), DownloadColumn(binary_units=False),
                            TransferSpeedColumn(), TimeRemainingColumn(), console=console, transient=True,
                            refresh_per_second=8)
        self.task = self.bar.add_task("scan", total=self.total, completed=self.done)
        self.bar.start()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.stop()
            self.bar = None
        return False
