#!/usr/bin/env python3
"""The README's screenshots: the first screen of a fixture log at 80 and 120 columns, as SVG
(rich's own export, colours included) and as plain text.

    python docs/screens.py            # write docs/screens/*.svg and *.txt
    python docs/screens.py --check    # exit 1 when a committed screenshot is stale (a test runs this)
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console
from rich.text import Text

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "docs" / "screens"
LOG = "fixtures/logs/seed/qwen3_30b_a3b_activation_offload_pp1_oom.log"
WIDTHS = (80, 120)


def render(width: int) -> tuple[str, str]:
    """(svg, text) of ``diagnose LOG`` at ``width`` columns, as a terminal shows it."""
    import os

    sys.path.insert(0, str(REPO))
    from diagnose.diagnosis import diagnose_paths
    from diagnose.remedy.causes import show_computed_overrides
    from diagnose.report import get_formatter

    cwd = os.getcwd()
    os.chdir(REPO)  # the path as a user in the clone types it
    try:
        report = diagnose_paths([LOG], jobs=1)
        show_computed_overrides(report)  # as the CLI shows them
    finally:
        os.chdir(cwd)
    # the same colours on every machine: an xterm, no NO_COLOR / FORCE_COLOR / COLORTERM of the caller's
    for k in ("NO_COLOR", "FORCE_COLOR", "COLORTERM", "COLUMNS"):
        os.environ.pop(k, None)
    os.environ["TERM"] = "xterm-256color"
    ansi = get_formatter("text", width=width, color="always").render(report)
    plain = get_formatter("text", width=width, color="never").render(report)
    with open(os.devnull, "w") as sink:
        console = Console(record=True, width=width, force_terminal=True, color_system="truecolor", file=sink)
        console.print(Text.from_ansi(ansi.rstrip("\n")), soft_wrap=True)
    svg = console.export_svg(title=f"diagnose {LOG}  ({width} columns)", unique_id=f"diagnose-{width}")
    return svg, plain


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare with the committed files instead of writing")
    a = ap.parse_args(argv)
    stale = []
    for w in WIDTHS:
        svg, text = render(w)
        for path, body in ((OUT / f"first-screen-{w}.svg", svg), (OUT / f"first-screen-{w}.txt", text)):
            if a.check:
                if not path.is_file() or path.read_text(encoding="utf-8") != body:
                    stale.append(path.name)
            else:
                OUT.mkdir(parents=True, exist_ok=True)
                path.write_text(body, encoding="utf-8")
                print(f"wrote {path.relative_to(REPO)}")
    if stale:
        print(f"stale screenshots: {', '.join(stale)} (run: python docs/screens.py)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
