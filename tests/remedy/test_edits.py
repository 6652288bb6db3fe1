"""diagnose/edits.py: one signature edit applied to a value, and a fix's overrides in the two
settings that read them (a diagnosis with a partial config, a preflight with the whole one)."""
from __future__ import annotations

from diagnose.edits import DELETE, apply_edit, fix_overrides
from diagnose.model import Edit, Fix, Signature


def sig(*fixes: Fix) -> Signature:
    return Signature(id="MB-TST-001", slug="t", title="t", category="other", severity="error", role="root",
                     scope="line", anchors=("x",), regex=None, cause="c", confirm_text="", confirm_when=None,
                     fixes=fixes, references=(), applies={}, tests_match=("x",), tests_no_match=(), file="t.yaml")


def test_apply_edit_each_op():
    assert apply_edit(3, Edit("k", "delete")) == (True, None)
    assert apply_edit(None, Edit("k", "delete")) == (False, None)  # nothing to delete
    assert apply_edit(4, Edit("k", "scale", 2)) == (True, 8)
    assert apply_edit(4, Edit("k", "scale", 2, max=6)) == (True, 6)
    assert apply_edit(3, Edit("k", "scale", 0.5)) == (True, 1.5)  # not forced to an int
    assert apply_edit(4, Edit("k", "add", 0.5)) == (True, 4.5)
    assert apply_edit(4, Edit("k", "add", 1)) == (True, 5)
    assert apply_edit(True, Edit("k", "scale", 2)) == (False, True)  # a bool is no number to scale
    assert apply_edit("x", Edit("k", "add", 1)) == (False, "x")
    assert apply_edit(0.25, Edit("k", "add", 0.25, max=1.0)) == (True, 0.5)


def test_fix_overrides_in_a_diagnosis_and_in_a_preflight():
    from diagnose.config.runconfig import RunConfig

    when_x = Fix(text="a", safety="safe", edits=(Edit("a.b", "set", 1),), when="model.x == 1")
    plain = Fix(text="b", safety="safe", edits=(Edit("c.d", "set", 2),))
    s = sig(when_x, plain)
    cfg = RunConfig({"c": {"d": 2}})
    # the diagnosis: an unknown `when` does not rule a fix out; unchanged edits are shown
    assert fix_overrides(s, cfg, {}, preflight=False) == ["a.b=1"]
    # the preflight: `when` must hold, and an edit that changes nothing is no fix
    assert fix_overrides(s, cfg, {}, preflight=True) == []
    assert fix_overrides(s, RunConfig({"c": {"d": 5}}), {}, preflight=True) == ["c.d=2"]
    assert fix_overrides(s, cfg, {"model": {"x": 1}}, preflight=True) == ["a.b=1"]
    assert fix_overrides(s, cfg, {"model": {"x": 0}}, preflight=False) == ["c.d=2"]
    assert DELETE is not None and repr(DELETE) == "DELETE"
