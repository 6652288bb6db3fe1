"""The first screen (issue 13): every report at 80, 100 and 160 columns fits the width, and the
root cause, its evidence and the full overrides are within the first 15 lines, never cut."""
from __future__ import annotations

from pathlib import Path

import pytest

from diagnose.db import load
from diagnose.diagnosis import diagnose_paths
from diagnose.remedy.causes import show_computed_overrides
from diagnose.report import get_formatter

REPO = Path(__file__).resolve().parents[2]
LOGS = sorted(p for p in (REPO / "fixtures" / "logs").rglob("*.log*") if p.is_file())
REAL = sorted((REPO / "fixtures" / "corpus" / "r3-nvidia").glob("*.log"))[:10]


@pytest.fixture(scope="module")
def reports():
    db = load()
    reps = {p: diagnose_paths([str(p)], db) for p in LOGS + REAL}
    for r in reps.values():
        show_computed_overrides(r)  # as the CLI shows them
    return reps


@pytest.mark.parametrize("width", [80, 100, 160])
@pytest.mark.parametrize("details", [False, True], ids=["first-screen", "details"])
def test_every_report_fits_the_width_and_tells_the_story_first(reports, width, details):
    assert len(reports) > 20
    for path, report in reports.items():
        _check_first_screen(path, report, width, details)


def _check_first_screen(path, report, width, details):
        out = get_formatter("text", width=width, details=details).render(report)
        lines = out.splitlines()
        assert all(len(line) <= width for line in lines), (path.name, max(lines, key=len))
        rc = report.root_cause
        if rc is None:
            assert lines[0].startswith("healthy"), path.name
            return
        head = "\n".join(lines[:15])
        assert f"[{rc.finding.signature.id}]" in lines[0], path.name
        compact = "".join(ln.strip() for ln in lines[:15]).replace(" ", "")  # a long path wraps mid-token
        assert f"{rc.hit.file}:{rc.hit.line}".replace(" ", "") in compact, path.name
        assert "   | " in head, path.name  # the evidence line
        if rc.overrides:
            flat = " ".join(ln.strip() for ln in lines[:15])
            for o in rc.overrides:  # every override whole, copy-pasteable, within the first screen
                assert o in flat.replace("overrides: ", ""), (path.name, o)
            assert not any("…" in ln for ln in lines if "=" in ln and "overrides" in ln), path.name
        if not details:
            path_lines = len(str(path)) // (width - 8)  # a long path wraps: the lines it takes beyond one
            assert len(lines) <= 15 + path_lines + len(report.notes) * 3, (path.name, len(lines))


@pytest.mark.parametrize("details", [False, True], ids=["first-screen", "details"])
def test_a_deep_path_still_leaves_the_overrides_on_the_first_screen(tmp_path, details):
    """CI once cloned into a longer folder than ours: the path took a third line at 80 columns and
    pushed the last override past line 15. The wrapped evidence is capped in both modes."""
    deep = tmp_path.joinpath(*["a-rather-long-folder-name"] * 4)
    deep.mkdir(parents=True)
    log = deep / "bridge_qwen3_30b_a3b_activation_offload_pp1_oom.log"
    log.write_bytes((REPO / "fixtures" / "logs" / log.name).read_bytes())
    report = diagnose_paths([str(log)], load())
    show_computed_overrides(report)
    assert len(report.root_cause.overrides) >= 5 and len(str(log)) > 150
    _check_first_screen(log, report, 80, details)


def test_columns_is_honoured(monkeypatch, reports):
    report = next(r for r in reports.values() if r.root_cause is not None)
    monkeypatch.setenv("COLUMNS", "72")
    out = get_formatter("text").render(report)
    assert max(len(ln) for ln in out.splitlines()) <= 72


@pytest.mark.parametrize("env,option,want", [({"NO_COLOR": "1"}, True, False), ({"FORCE_COLOR": "1"}, False, True),
                                             ({}, True, True), ({}, False, False), ({"NO_COLOR": "1"}, "always", True),
                                             ({"FORCE_COLOR": "1"}, "never", False)])
def test_colour_follows_the_flag_and_the_environment(monkeypatch, reports, env, option, want):
    """option: True/False = stdout is / is not a terminal (--color auto); "always"/"never" = --color."""
    for k in ("NO_COLOR", "FORCE_COLOR"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    report = next(r for r in reports.values() if r.root_cause is not None)
    out = get_formatter("text", width=100, color=option).render(report)
    assert ("\x1b[" in out) is want


def test_the_readme_screenshots_are_current():
    """docs/screens.py makes the README's screenshots (SVG from rich's export, and text): they
    must be what the tool prints today, and the README's text block the 80-column one."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR", "COLUMNS")}
    r = subprocess.run([sys.executable, str(REPO / "docs" / "screens.py"), "--check"], capture_output=True,
                       text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    screen = (REPO / "docs" / "screens" / "first-screen-80.txt").read_text()
    assert screen.strip() in (REPO / "README.md").read_text()
    assert "(80&#160;columns)" in (REPO / "docs" / "screens" / "first-screen-80.svg").read_text()
