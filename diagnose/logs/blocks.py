"""Block readers: a hit of a block's anchor starts a reader that takes the lines after it until
it is done (timer blocks, tracebacks and headless ones, torchrun's ChildFailedError summary,
Megatron-LM's ``arguments`` dump, Bridge's ``Final configuration:`` YAML and its non-default
summary). The scan feeds them (diagnose/scan.py); ``config_blocks_of_text`` reads the config
blocks of a log's text alone (config/load.py).
"""
from __future__ import annotations

import re

from .anchors import ANCHORS
from .lines import clean, key_and_cut, prefix_key, split_prefix
from .parsers import _EXC_LINE
from .records import (
    MAX_RECORDS,
    Structure,
    TorchrunFailure,
    Traceback,
    add_config_block,
    add_timer_record,
    add_timers,
    add_torchrun,
)
from .values import literal

_TIMER_LINE = re.compile(r"^\s{2,}([\w\-/ ]+?)\s*\.{2,}\s*:\s*(?:\(\s*([\d.]+),\s*([\d.]+)\)|([\d.]+))\s*$")
# the line that ends a traceback may name any class: one without an Error-like suffix counts
# there when it is dotted (triton.runtime.errors.OutOfResources, queue.Empty) or a builtin one
_TB_EXC_LINE = re.compile(
    r"^((?:[a-z_][\w]*\.)+[A-Z][a-z]\w*|StopIteration|StopAsyncIteration)(?::\s?(.*))?$")
_RANK_ENTRY = re.compile(r"\[\d+\]:")
# Frames as other renderers print them, read as Python's own 'File "path", line N, in func' so that
# the layers see them alike: IPython ("path.py in func(args)"; since IPython 8 "File path.py:N, in
# func(args)"; the line it was on marked "----> N"), rich (a box of "│ path.py:N in func │" lines,
# the line it was on marked "❱ N │"; a long path or name wraps onto the next box line).
_IPY_FRAME = re.compile(r"^(?:File )?(\S+\.py|<ipython-input-[^>\s]+>|<cell line: \d+>)(?::(\d+),)?"
                        r" in (?:\w+\.)*([\w<>]+)(?:\(|\s*$)")
_IPY_ARROW = re.compile(r"^-+> ?(\d+)\s+(.*)$")
_RICH_FRAME = re.compile(r"^│\s*(\S+?):(\d+) in ?([\w<>.]*)\s*│?$")
_RICH_CURRENT = re.compile(r"^│\s*❱\s*\d+\s*│\s*(.*?)\s*│?$")
_RICH_NAME = re.compile(r"^│\s*([\w<>.]+)\s*│$")
_TORCHRUN_FIELD = re.compile(r"^\s+(time|host|rank|exitcode|error_file|traceback)\s*:\s?(.*)$")
_ARGS_LINE = re.compile(r"^\s+(\S+) \.{3,} (.*)$")
_SUMMARY_SECTION = re.compile(r"^\[(\w+)\](?: Non-default values.*:|:)\s*$")
_SUMMARY_FIELD = re.compile(r"^\s{2}(\w+): (.*?)(?:\s{2}\(Mcore default: .*\))?\s*$")
_YAML_LINE = re.compile(r"^(\s*)(?:- |[\w.\-]+:(?:\s|$)|-$)")


class Block:
    """Reads lines after a start anchor until it is done (``feed`` returns False)."""

    max_lines = 2000

    @staticmethod
    def wanted(structure: Structure, file: str, line: int, first: str) -> bool:
        """Does a hit of the start anchor on this line start a block? (default: always)"""
        return True

    def __init__(self, structure: Structure, file: str, line: int, first: str):
        self.s, self.file, self.start_line = structure, file, line
        self.n = 0
        self.start(first)

    def start(self, first: str):
        pass

    def feed(self, raw: bytes, line: int) -> bool:
        return self.feed_text(clean(raw), line)

    def feed_text(self, text: str, line: int) -> bool:
        """The next line, decoded (``feed`` decodes it); False when the block is done."""
        self.n += 1
        if self.n > self.max_lines:
            self.finish()
            return False
        if not self.line(text, line):
            self.finish()
            return False
        return True

    def line(self, text: str, line: int) -> bool:
        return False

    def finish(self):
        pass


class TimerBlock(Block):
    max_lines = 200

    def start(self, first):
        self.values = {}

    def line(self, text, line):
        _, msg = split_prefix(text)
        m = _TIMER_LINE.match(msg)
        if not m:
            return False
        name = m.group(1).strip()
        if m.group(4) is not None:
            self.values[name] = (float(m.group(4)), float(m.group(4)))
        else:
            self.values[name] = (float(m.group(2)), float(m.group(3)))
        return True

    def finish(self):
        if self.values:
            self.s.note("timers", self.file, self.start_line, "timers: " + ", ".join(
                f"{k} {v[1]:.1f} ms" for k, v in list(self.values.items())[:6]), replace=True)
            self.s.timer_blocks += 1
            add_timers(self.s, self.values)
            add_timer_record(self.s, self.file, self.start_line, {k: v[1] for k, v in self.values.items()})


class TracebackBlock(Block):
    """One rank's traceback, followed through other ranks' interleaved lines by its prefix.

    Keeps the frames and their source lines (bounded: the outermost few and the innermost many)
    so that a traceback whose exception line the log lost (a cut paste, a killed process) still
    says where it failed (analyze/layers.py reads them)."""

    max_lines = 600
    MAX_FRAMES = 48
    # other prefixes' lines passed before the traceback is taken as ended: 512 ranks crashing at
    # once interleave their tracebacks line by line, so one rank's 60 lines can span 30,000 (the
    # scan passes over them in bulk: scan._LineTable)
    MAX_OTHERS = 50_000

    def other_lines(self, count: int) -> bool:
        """``count`` lines of other prefixes passed (what ``line`` says of each; the scan's fast
        path counts them without reading them): False when the block is done."""
        if count <= 0:
            return True
        self.others += count  # max_lines bounds the block's own lines
        if self.others >= self.MAX_OTHERS:
            self.finish()
            return False
        return True

    def start(self, first):
        self.key = prefix_key(first)
        self.rank, msg = split_prefix(first)
        self.frames: list = []
        self.source: list = []
        self.others = 0
        self.last = self.start_line
        self.done = False
        self.ipython = self.unnamed = False
        self.s.tb_until[(self.file, self.key)] = self.start_line
        if msg.strip().startswith("File "):  # headless: the paste starts at a frame
            self._keep(msg.strip(), "")

    def _keep(self, frame: str, src: str):
        self.frames.append(frame)
        self.source.append(src)
        if len(self.frames) > self.MAX_FRAMES:  # drop from the middle: outermost 8, innermost 40
            del self.frames[8], self.source[8]

    def line(self, text, line):
        key, cut = key_and_cut(text)
        if key != self.key:
            self.others += 1
            return self.others < self.MAX_OTHERS
        return self.own(text[cut:], line)

    def feed_own(self, msg: str, line: int) -> bool:
        """A line of this block's own prefix, the prefix already cut off (``msg``), as the
        scan's line table hands them over (scan._LineTable); False when the block is done."""
        self.n += 1
        if self.n > self.max_lines or not self.own(msg, line):
            self.finish()
            return False
        return True

    def other_renderer(self, stripped: str, line: int) -> bool:
        """A line of an IPython or rich traceback (_IPY_FRAME, _RICH_FRAME): its frame kept as
        Python's, the line it was on as its source; False for any other line."""
        if stripped.startswith(("│", "╭", "╰")):  # rich's box
            m = _RICH_FRAME.match(stripped)
            if m:
                self._keep(f'File "{m.group(1)}", line {m.group(2)}, in {m.group(3)}', "")
                self.last = line
                self.unnamed = not m.group(3)
            elif self.frames and self.unnamed and (n := _RICH_NAME.match(stripped)):
                self.frames[-1] += n.group(1)  # the name wrapped onto the next line
                self.unnamed = False
            elif self.frames and (cur := _RICH_CURRENT.match(stripped)):
                self.source[-1] = cur.group(1)
            return True
        m = _IPY_FRAME.match(stripped)
        if m:
            self._keep(f'File "{m.group(1)}", line {m.group(2) or 0}, in {m.group(3)}', "")
            self.last, self.ipython = line, True
            return True
        arrow = _IPY_ARROW.match(stripped)
        if arrow and self.frames:
            self.source[-1] = arrow.group(2).strip()
            if self.ipython:  # older IPython gives the frame's line number only here
                self.frames[-1] = self.frames[-1].replace(", line 0, in ", f", line {arrow.group(1)}, in ", 1)
            return True
        return False

    def own(self, msg: str, line: int) -> bool:
        stripped = msg.strip()
        self.s.tb_until[(self.file, self.key)] = line
        indent = len(msg) - len(msg.lstrip())
        exc = (_EXC_LINE.match(stripped) or _TB_EXC_LINE.match(stripped)) if stripped and indent <= 1 else None
        if exc:  # a paste may indent it by one
            indent = 0
        if (not exc and stripped and not indent and not stripped.startswith(('File "', "^", "~"))
                and self.other_renderer(stripped, line)):
            return True
        if not stripped or stripped.startswith(("File ", "^", "~")) or indent:
            if stripped.startswith("File "):
                self._keep(stripped, "")
                self.last = line
            elif (stripped and self.frames and not self.source[-1] and not self.ipython
                  and not stripped.startswith(("^", "~"))):
                self.source[-1] = stripped  # (IPython's context lines are not the line it was on)
            return True
        m = exc
        if m:
            self.done = True
            self.s.traceback_count += 1
            if len(self.s.tracebacks) < MAX_RECORDS:
                self.s.tracebacks.append(Traceback(self.file, line, self.rank, m.group(1), (m.group(2) or "").strip(),
                                                   msg, list(self.frames), list(self.source), self._headless(),
                                                   self.start_line))
            return False
        return bool(stripped.startswith(("During handling", "The above exception")))

    def finish(self):
        # the traceback ended without an exception line: the log was cut, or the process died
        if self.done or not self.frames:
            return
        self.done = True
        self.s.traceback_count += 1
        if len(self.s.tracebacks) < MAX_RECORDS:
            self.s.tracebacks.append(Traceback(self.file, self.last, self.rank, None, "", self.frames[-1],
                                               list(self.frames), list(self.source), self._headless(),
                                               self.start_line))

    def _headless(self) -> tuple | None:
        return None


class FrameBlock(TracebackBlock):
    """A traceback whose header the paste lost: it starts at a frame line that no traceback
    reader has taken."""

    def _headless(self) -> tuple | None:
        return (self.key, self.start_line)

    @staticmethod
    def wanted(structure, file, line, first):
        key, cut = key_and_cut(first)
        return first[cut:].lstrip().startswith('File "') and structure.tb_until.get((file, key), 0) < line


class TorchrunBlock(Block):
    """torchrun's ChildFailedError summary: Failures and Root Cause (first observed failure)."""

    max_lines = 3000
    MAX_STRAY = 20  # lines in a row that are no part of a summary: it was cut, the block ends

    @staticmethod
    def wanted(structure, file, line, first):
        """Not the traceback's own lines that name the class (``raise ChildFailedError(``, a
        frame): the summary starts at the exception line or at "Root Cause"."""
        msg = split_prefix(first)[1].lstrip()
        return not msg.startswith(("raise ", "File ", "from ", "import "))

    def start(self, first):
        self.section = "root" if "Root Cause" in first else None
        self.cur: TorchrunFailure | None = None
        self.in_tb = False
        self.rules = 0
        self.stray = 0

    def _close(self):
        if self.cur is not None:
            add_torchrun(self.s, self.cur)
        self.cur = None

    def line(self, text, line):
        before = self.stray
        keep = self._line(text, line)
        if self.stray == before:  # a line of the summary: the count of stray lines in a row restarts
            self.stray = 0
        return keep

    def _line(self, text, line):
        _, msg = split_prefix(text)
        st = msg.strip()
        if st.startswith("====="):
            self.rules += 1
            return not self.rules >= 2
        if st.startswith("Failures:"):
            self.section, self.in_tb = "failure", False
            return True
        if st.startswith("Root Cause (first observed failure)"):
            self._close()
            self.section, self.in_tb = "root", False
            return True
        if st.startswith("-----"):
            self._close()
            self.in_tb = False
            return True
        if _RANK_ENTRY.fullmatch(st):
            self._close()
            if self.section:
                self.cur = TorchrunFailure(self.section, file=self.file, line=line)
            self.in_tb = False
            return True
        m = _TORCHRUN_FIELD.match(msg)
        if m and self.cur is not None and not (self.in_tb and msg.startswith("    ")):
            k, v = m.group(1), m.group(2).strip()
            if k == "rank":
                rm = re.match(r"(\d{1,9})(?: \(local_rank: (\d{1,9})\))?", v)
                if rm:
                    self.cur.rank = int(rm.group(1))
                    self.cur.local_rank = int(rm.group(2)) if rm.group(2) else None
            elif k == "exitcode":
                em = re.match(r"(-?\d+)", v)
                self.cur.exitcode = int(em.group(1)) if em else None
            elif k == "traceback":
                self.cur.traceback = v
                self.in_tb = True
            else:
                setattr(self.cur, k, v)
            return True
        if self.in_tb and self.cur is not None:
            if len(self.cur.traceback) < 20000:
                self.cur.traceback += "\n" + msg
            return True
        if self.section is None:
            return self.n < 40  # before "Failures:" the header lines
        self.stray += 1
        return self.stray <= self.MAX_STRAY

    def finish(self):
        self._close()


class ArgsBlock(Block):
    """Megatron-LM's ``arguments`` dump."""

    max_lines = 3000

    def start(self, first):
        self.args = {}

    def line(self, text, line):
        _, msg = split_prefix(text)
        if "end of arguments" in msg:
            return False
        m = _ARGS_LINE.match(msg)
        if m:
            self.args[m.group(1)] = literal(m.group(2))
            return True
        return not msg.strip() or self.n < 3

    def finish(self):
        if self.args:
            add_config_block(self.s, ("mlm_args", self.file, self.start_line, self.args))


class BridgeYamlBlock(Block):
    """Bridge's ``Final configuration:`` followed by the ConfigContainer YAML (pre-validation)."""

    max_lines = 5000

    def start(self, first):
        self.lines = []
        self.key = None

    def line(self, text, line):
        _, msg = split_prefix(text)
        if self.key is None:
            if not msg.strip():
                return self.n < 3
            self.key = prefix_key(text)
        if _YAML_LINE.match(msg) or (msg.startswith("  ") and self.lines):
            self.lines.append(msg)
            return True
        return False

    def finish(self):
        import yaml

        if not self.lines:
            return
        from ..yamlsafe import check_expansion

        try:
            doc = yaml.safe_load("\n".join(self.lines))
            check_expansion(doc, f"{self.file}:{self.start_line}")  # an alias bomb inside a log, too
        except (yaml.YAMLError, RecursionError, ValueError):
            self.s.note("config_block_refused", self.file, self.start_line,
                        "a 'Final configuration:' block that is not a config (invalid YAML or an alias bomb)")
            return
        if isinstance(doc, dict):
            add_config_block(self.s, ("bridge_yaml", self.file, self.start_line, doc))


class BridgeSummaryBlock(Block):
    """Bridge's post-validation ``Configuration Summary (Non-Default Values vs Megatron Core)``."""

    max_lines = 3000

    def start(self, first):
        self.doc: dict = {}
        self.section = None
        self.rules = 0

    def line(self, text, line):
        _, msg = split_prefix(text)
        st = msg.strip()
        if st.startswith("=" * 10):
            self.rules += 1
            return self.rules < 2
        if not st or st.startswith(("-" * 10, "Other Configuration Values")):
            return True
        m = _SUMMARY_SECTION.match(st)
        if m:
            self.section = m.group(1)
            self.doc.setdefault(self.section, {})
            return True
        m = _SUMMARY_FIELD.match(msg)
        if m and self.section:
            self.doc[self.section][m.group(1)] = literal(m.group(2))
            return True
        return False

    def finish(self):
        if self.doc:
            add_config_block(self.s, ("bridge_summary", self.file, self.start_line, self.doc))



BLOCKS = {
    "@timers": TimerBlock,
    "@traceback": TracebackBlock,
    "@frame": FrameBlock,
    "@torchrun": TorchrunBlock,
    "@mlm_args": ArgsBlock,
    "@bridge_yaml": BridgeYamlBlock,
    "@bridge_summary": BridgeSummaryBlock,
}
CONFIG_KEYS = ("@mlm_args", "@bridge_yaml", "@bridge_summary")


def config_blocks_of_text(text: str, name: str) -> list:
    """The config blocks a log's text holds (Megatron-LM's arguments dump, Bridge's "Final
    configuration:" YAML and its configuration summary), read line by line as the scan reads
    them, without the signature scan: what ``--config LOG`` needs (config/load.py)."""
    s = Structure()
    open_blocks: list = []
    for no, raw in enumerate(text.encode("utf-8", "surrogateescape").split(b"\n"), start=1):
        line = clean(raw)  # as the scan decodes a line (a progress bar's CR, ANSI codes, NULs)
        open_blocks = [b for b in open_blocks if b.feed_text(line, no)]
        for key in CONFIG_KEYS:
            block = BLOCKS[key]
            if any(a in line for a in ANCHORS[key]) and block.wanted(s, name, no, line):
                open_blocks.append(block(s, name, no, line))
    for b in open_blocks:
        b.finish()
    return s.config_blocks

