"""``--format junit``: JUnit XML as GitLab (``artifacts:reports:junit``), Jenkins and Azure read it.

``<testsuites>`` holds one ``<testsuite>`` per signature family (the database file: offload, oom,
nccl, ...) and one ``<testcase>`` per signature of the whole database, so dashboards trend each
signature over nightly runs: a signature whose finding fails the gate (at or above ``--fail-on``,
not in the ``--baseline``) is a ``<failure>``; one found below the threshold, or accepted by the
baseline, passes with the evidence in ``<system-out>``; one not found passes.
"""
from __future__ import annotations

import datetime as _dt
import socket
import xml.etree.ElementTree as ET
from collections import OrderedDict

from ..model import Report, Role
from . import ci
from .base import Formatter


def _clean_xml(s: str) -> str:
    """Drop characters XML 1.0 cannot hold (a log line may carry any byte)."""
    return "".join(ch for ch in s if ch in "\t\n\r" or 0x20 <= ord(ch) <= 0xD7FF or 0xE000 <= ord(ch) <= 0xFFFD
                   or 0x10000 <= ord(ch) <= 0x10FFFF)


class JunitFormatter(Formatter):
    name = "junit"

    def render(self, report: Report) -> str:
        db = self.options.get("db")
        if db is None:
            from ..db import load

            db = load()
        g = ci.gate_of(report, self.fail_on, self.options.get("baseline"))
        by_sig = {f.signature.id: f for f in report.findings}
        sigs = list(db.signatures)
        ids = {s.id for s in sigs}
        sigs += [f.signature for f in report.findings if f.signature.id not in ids]
        # the root cause's suite and case first, then the findings (ci.ordered), then the rest
        first = [f.signature.id for f in ci.ordered(report)]
        rank = {sid: i for i, sid in enumerate(first)}
        sigs.sort(key=lambda s: rank.get(s.id, len(rank)))

        suites: OrderedDict[str, list] = OrderedDict()
        for s in sigs:
            family = (s.file or "other").rsplit(".", 1)[0]
            suites.setdefault(family, []).append(s)

        stamp = _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()
        inputs = ", ".join(report.inputs) or "-"
        root = ET.Element("testsuites", name="diagnose", time=f"{report.seconds:.3f}")
        total = failures = 0
        for family, members in suites.items():
            suite = ET.SubElement(root, "testsuite", name=f"diagnose.{family}", timestamp=stamp,
                                  hostname=socket.gethostname() or "localhost")
            props = ET.SubElement(suite, "properties")
            ET.SubElement(props, "property", name="inputs", value=_clean_xml(inputs))
            ET.SubElement(props, "property", name="fail_on", value=self.fail_on)
            nfail = 0
            for s in members:
                case = ET.SubElement(suite, "testcase", classname=f"diagnose.{family}.{s.category}",
                                     name=f"{s.id} {s.slug}", time="0")
                f = by_sig.get(s.id)
                if f is None:
                    continue
                case.set("file", f.first.file)
                case.set("line", str(f.first.line))
                st = ci.status(f, g)
                msg = _clean_xml(ci.message(f, report))
                if st == "fail":
                    nfail += 1
                    fail = ET.SubElement(case, "failure", type=f"{s.severity}:{s.category}",
                                         message=_clean_xml(f"{ci.summary_line(f)} at {f.first.file}:{f.first.line}"))
                    fail.text = msg
                else:
                    out = ET.SubElement(case, "system-out")
                    why = ("accepted by the baseline" if st == "baseline"
                           else f"below --fail-on {self.fail_on}" if s.role != Role.ADVICE else "advice, never fails")
                    out.text = f"found ({why}):\n{msg}"
            suite.set("tests", str(len(members)))
            suite.set("failures", str(nfail))
            suite.set("errors", "0")
            suite.set("skipped", "0")
            suite.set("time", "0")
            total += len(members)
            failures += nfail
        root.set("tests", str(total))
        root.set("failures", str(failures))
        root.set("errors", "0")
        ET.indent(root)
        return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
