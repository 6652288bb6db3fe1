"""The evidence-layer tables (diagnose/layer_tables.py): named cases of rows the loader refuses
with the reason, rows it takes with every field as written, and what a row holds for."""
from __future__ import annotations

import pytest

from diagnose.db import load
from diagnose.layer_tables import LayerError, Row, check_against, load_tables

REFUSED = {
    "not-a-mapping": ("by_exception: [just-a-string]", "a row must be a mapping"),
    "unknown-field": ("by_exception: [{id: x, signature: MB-GEN-011, types: [E], colour: red}]",
                      "unknown field(s) ['colour']"),
    "no-id": ("by_exception: [{signature: MB-GEN-011, types: [E]}]", "'id' and 'signature' are required"),
    "no-signature": ("by_exception: [{id: x, types: [E]}]", "'id' and 'signature' are required"),
    "bad-message": ("by_exception: [{id: x, signature: MB-GEN-011, message: '('}]", "message does not compile"),
    "bad-frames": ("by_traceback: [{id: x, signature: MB-GEN-011, frames: '[a'}]", "frames does not compile"),
    "bad-source": ("by_traceback: [{id: x, signature: MB-GEN-011, source: '(?P<'}]", "source does not compile"),
    "bad-before": ("by_context: [{id: x, signature: MB-GEN-017, before: '(', within: 3}]", "before does not compile"),
    "types-not-list": ("by_exception: [{id: x, signature: MB-GEN-011, types: OutOfMemoryError}]",
                       "'types' must be a list of class names"),
    "types-not-strings": ("by_exception: [{id: x, signature: MB-GEN-011, types: [1]}]",
                          "'types' must be a list of class names"),
    "exception-reads-frames": ("by_exception: [{id: x, signature: MB-GEN-011, frames: a}]",
                               "by_exception rows read the type and message only"),
    "exception-reads-source": ("by_exception: [{id: x, signature: MB-GEN-011, source: a}]",
                               "by_exception rows read the type and message only"),
    "traceback-without-frames": ("by_traceback: [{id: x, signature: MB-GEN-011, message: a}]",
                                 "a by_traceback row needs 'frames' or 'source'"),
    "context-without-before": ("by_context: [{id: x, signature: MB-GEN-017, message: a}]",
                               "'before' (with 'within') is for by_context rows"),
    "before-outside-context": ("by_exception: [{id: x, signature: MB-GEN-017, types: [E], before: a, within: 3}]",
                               "'before' (with 'within') is for by_context rows"),
    "within-zero": ("by_context: [{id: x, signature: MB-GEN-017, before: a, within: 0}]",
                    "'within' must be a positive number of lines"),
    "within-text": ("by_context: [{id: x, signature: MB-GEN-017, before: a, within: three}]",
                    "'within' must be a positive number of lines"),
    "empty-row": ("by_exception: [{id: x, signature: MB-GEN-011}]", "a row needs 'types', 'message'"),
    "cut-not-bool": ("by_traceback: [{id: x, signature: MB-GEN-011, frames: a, cut: 1}]", "'cut' is true or false"),
    "cut-on-exception-row": ("by_exception: [{id: x, signature: MB-GEN-011, types: [E], cut: true}]",
                             "'cut' is true or false, and only for by_traceback rows"),
    "innermost-zero": ("by_traceback: [{id: x, signature: MB-GEN-011, frames: a, innermost: 0}]",
                       "'innermost' must be a positive integer"),
    "innermost-text": ("by_traceback: [{id: x, signature: MB-GEN-011, frames: a, innermost: two}]",
                       "'innermost' must be a positive integer"),
    "duplicate-id": ("by_exception: [{id: x, signature: MB-GEN-011, types: [E]}, {id: x, signature: MB-GEN-011, "
                     "types: [F]}]", "x: duplicate row id"),
    "no-schema-version": ("by_exception: []", "schema_version: 1"),
    "unknown-section": ("by_frames: []", "unknown section(s) ['by_frames']"),
}


def _tables(tmp_path, body: str, version: bool = True):
    d = tmp_path / "db"
    (d / "layers").mkdir(parents=True)
    (d / "layers" / "t.yaml").write_text(("schema_version: 1\n" if version else "") + body + "\n")
    return load_tables(str(d))


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_bad_row_is_refused_with_its_reason(tmp_path, name):
    body, reason = REFUSED[name]
    with pytest.raises(LayerError) as exc:
        _tables(tmp_path, body, version=name != "no-schema-version")
    assert reason in str(exc.value) and "t.yaml" in str(exc.value), str(exc.value)
    if name == "no-id":  # a row without its id is named "?"
        assert str(exc.value).startswith("t.yaml: ?: "), str(exc.value)


def test_a_row_keeps_every_field_as_written(tmp_path):
    t = _tables(tmp_path, """
by_exception:
  - {id: e, signature: MB-GEN-011, types: [OutOfMemoryError, MemoryError], message: 'out of memory'}
by_traceback:
  - {id: t, signature: MB-GEN-010, frames: 'in load$', source: '^import ', innermost: 3, cut: true}
by_context:
  - {id: c, signature: MB-GEN-017, before: 'Saving checkpoint', within: 12}
""")
    e, tb, c = t.by_exception[0], t.by_traceback[0], t.by_context[0]
    assert (e.id, e.signature, e.types, e.innermost, e.cut) == ("e", "MB-GEN-011",
                                                               frozenset({"OutOfMemoryError", "MemoryError"}), None, False)
    assert e.message.search("CUDA OUT OF MEMORY") and e.frames is None and e.source is None and e.basis == "exception"
    assert (tb.innermost, tb.cut, tb.basis) == (3, True, "traceback")
    assert tb.frames.search('File "a.py", line 1, in load') and not tb.frames.search('File "a.py", line 1, in LOAD')
    assert tb.source.search("import torch") and tb.message is None and tb.before is None
    assert (c.within, c.basis) == (12, "context") and c.before.search("Saving checkpoint to /x")
    assert e.within == 0 and tb.within == 0  # only a context row looks back
    one = _tables(tmp_path / "one", "by_context: [{id: c, signature: MB-GEN-017, before: x, within: 1}]")
    assert one.by_context[0].within == 1  # one line back is the least
    assert t.rows() == (e, tb, c)


def test_the_real_tables_load_and_name_layer_signatures():
    db = load()
    t = load_tables(db.root)
    assert t.by_exception and t.by_traceback and t.by_context and t.startup
    check_against(t, db)  # every row names a scope: layer signature
    assert t.startup_line("All DDP processes registered. Starting ddp with 2 processes")
    assert not t.startup_line("iteration 10/100 | elapsed time per iteration (ms): 1000.0")


@pytest.mark.parametrize("signature", ["MB-NO-SUCH", "MB-OOM-001"])  # unknown; a line signature, not a layer one
def test_a_row_must_name_a_layer_signature(tmp_path, signature):
    t = _tables(tmp_path, f"by_exception: [{{id: x, signature: {signature}, types: [E]}}]")
    with pytest.raises(LayerError, match=f"x: '{signature}' is not a scope: layer signature"):
        check_against(t, load())


FRAMES = ['File "train.py", line 10, in main', 'File "ckpt.py", line 20, in load_checkpoint',
          'File "io.py", line 30, in read']
SOURCE = ["main()", "load_checkpoint(path)", ""]
HOLDS = {
    # (row fields, etype, message, frames, source) -> holds
    "type-of-a-ray-wrapper": (dict(types=frozenset({"OutOfMemoryError"})),
                              "ray.exceptions.RayTaskError(OutOfMemoryError)", "", [], [], True),
    "type-differs": (dict(types=frozenset({"OutOfMemoryError"})), "ValueError", "", [], [], False),
    "no-type-given": (dict(types=frozenset({"OutOfMemoryError"})), None, "", FRAMES, SOURCE, False),
    "message-any-case": (dict(message="out of memory"), "RuntimeError", "CUDA Out Of Memory", [], [], True),
    "message-absent": (dict(message="out of memory"), "RuntimeError", "shape mismatch", [], [], False),
    "frames-anywhere": (dict(frames="in main$"), None, "", FRAMES, SOURCE, True),
    "frames-not-innermost": (dict(frames="in main$", innermost=2), None, "", FRAMES, SOURCE, False),
    "frames-innermost": (dict(frames="in load_checkpoint$", innermost=2), None, "", FRAMES, SOURCE, True),
    "source-not-innermost": (dict(source="^main", innermost=2), None, "", FRAMES, SOURCE, False),
    "source-innermost": (dict(source="^load_checkpoint", innermost=2), None, "", FRAMES, SOURCE, True),
    "source-empty-line-never": (dict(source="^$"), None, "", FRAMES, SOURCE, False),
    "cut-and-cut": (dict(frames="in read$", cut=True), None, "", FRAMES, SOURCE, True),
    "cut-but-an-exception": (dict(frames="in read$", cut=True), "KeyError", "x", FRAMES, SOURCE, False),
    "all-fields-must-hold": (dict(types=frozenset({"KeyError"}), message="state_dict"), "KeyError", "optimizer",
                             [], [], False),
}


@pytest.mark.parametrize("name", sorted(HOLDS))
def test_what_a_row_holds_for(name):
    import regex

    fields, etype, message, frames, source, want = HOLDS[name]
    pats = {k: regex.compile(v, regex.IGNORECASE if k == "message" else 0)
            for k, v in fields.items() if k in ("message", "frames", "source")}
    row = Row("r", "MB-GEN-011", **{**fields, **pats})
    assert row.holds(etype, message, frames, source) is want
