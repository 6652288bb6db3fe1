"""The loader refuses bad databases with a message naming the file and the id."""
import textwrap

import pytest

from diagnose import db as DB

GOOD = """
  - id: MB-TST-001
    slug: test-sig
    title: A test signature
    category: other
    severity: error
    role: root
    match:
      anchors: ["boom happened"]
      regex: 'boom happened (?P<n>\\d+)'
    cause: test
    tests:
      match: ["boom happened 3"]
      no_match: ["nothing"]
"""


def _write(tmp_path, body, name="fam.yaml", version=1):
    d = tmp_path / "sigs"
    d.mkdir(exist_ok=True)
    (d / name).write_text(f"schema_version: {version}\nsignatures:\n" + textwrap.dedent(body))
    DB._load.cache_clear()
    return str(d)


def test_good_file_loads(tmp_path):
    d = DB.load(_write(tmp_path, GOOD))
    assert d.get("MB-TST-001").slug == "test-sig"
    assert d.get("test-sig").id == "MB-TST-001"


def test_no_examples_is_refused(tmp_path):
    body = GOOD.replace('      match: ["boom happened 3"]\n', "")
    with pytest.raises(DB.DatabaseError, match=r"fam.yaml: MB-TST-001: has no examples"):
        DB.load(_write(tmp_path, body))


def test_duplicate_id_is_refused(tmp_path):
    body = GOOD + GOOD.replace("slug: test-sig", "slug: other-sig")
    with pytest.raises(DB.DatabaseError, match=r"MB-TST-001: duplicate id"):
        DB.load(_write(tmp_path, body))


def test_bad_regex_is_refused(tmp_path):
    body = GOOD.replace("(?P<n>\\d+)", "(?P<n>\\d+")
    with pytest.raises(DB.DatabaseError, match=r"fam.yaml: MB-TST-001: regex does not compile"):
        DB.load(_write(tmp_path, body))


def test_nested_unbounded_quantifier_is_refused(tmp_path):
    body = GOOD.replace("(?P<n>\\d+)", "(a+)+")
    with pytest.raises(DB.DatabaseError, match=r"nested unbounded quantifier"):
        DB.load(_write(tmp_path, body))


def test_unknown_category_and_field(tmp_path):
    with pytest.raises(DB.DatabaseError, match=r"category 'bogus'"):
        DB.load(_write(tmp_path, GOOD.replace("category: other", "category: bogus")))
    with pytest.raises(DB.DatabaseError, match=r"unknown field"):
        DB.load(_write(tmp_path, GOOD.replace("cause: test", "cause: test\n    colour: red")))


def test_schema_version_is_checked(tmp_path):
    with pytest.raises(DB.DatabaseError, match=r"schema_version 2 is not supported"):
        DB.load(_write(tmp_path, GOOD, version=2))


def test_unsafe_predicate_is_refused(tmp_path):
    body = GOOD.replace("cause: test", "cause: test\n    confirm: {text: x, when: \"__import__('os').system('id')\"}")
    with pytest.raises(DB.DatabaseError, match=r"only .* may be called|not allowed"):
        DB.load(_write(tmp_path, body))


def test_version_applicability():
    d = DB.load()
    s6, s7 = d.get("MB-OFF-006"), d.get("MB-OFF-007")
    assert DB.applies_to(s6, {"megatron-core": "0.16.1"}) and not DB.applies_to(s7, {"megatron-core": "0.16.1"})
    assert DB.applies_to(s7, {"megatron-core": "0.19.2"}) and not DB.applies_to(s6, {"megatron-core": "0.19.2"})
    assert DB.applies_to(s6, {})


def test_version_ranges_follow_the_released_sources():
    """Checked against the Megatron-LM tags (issue 12, item 8): the activation_offload_fraction and
    fused_group_mlp messages first appear in core_v0.19.0 (not 0.18.2); the distributed optimizer's
    'Only Adam ...' assertion has two wordings (<= 0.18.2 and 0.19.0), both anchored."""
    from diagnose.db import applies_to, load
    from diagnose.diagnosis import diagnose_text

    db = load()
    for sid in ("MB-OFF-023", "MB-OFF-024"):
        sig = db.get(sid)
        assert not applies_to(sig, {"megatron-core": "0.18.2"}) and applies_to(sig, {"megatron-core": "0.19.0"})
    old = ("[rank0]: AssertionError: Only Adam and HybridDeviceOptimizer currently supported, "
           "due to checkpointing requirements.\n")
    assert diagnose_text(old).root_cause.finding.signature.id == "MB-OFF-034"


@pytest.mark.parametrize("field,why", [("    priority: high\n", "priority: expected an integer"),
                                       ("    priority: 99999999\n", "priority: expected an integer"),
                                       ("    match: {anchors: [xyz], regex: 5}\n", "regex must be a string"),
                                       # found by tests/remedy/test_fuzz_surfaces.py (they raised TypeError /
                                       # AttributeError before)
                                       ("    tags: 2026-12-02\n", "'tags' must be a list of strings"),
                                       ("    supersedes: 3\n", "'supersedes' must be a list of strings"),
                                       ("    confirm: 1\n", "'confirm' is a text, or a mapping"),
                                       ("    fixes: 1\n", "'fixes' must be a list"),
                                       ("    metric: 2026-12-02\n", "'metric' must be a string"),
                                       ("    version: x\n", "version: expected a positive integer")])
def test_bad_signature_fields_are_one_line_errors(tmp_path, field, why):
    from diagnose.db import DatabaseError, load

    body = ("schema_version: 1\nsignatures:\n  - id: MB-X-001\n    slug: x\n    title: x\n    category: other\n"
            "    severity: error\n    role: root\n    cause: x\n    tests:\n      match: [xyz]\n")
    if "match:" not in field:
        body += "    match: {anchors: [xyz]}\n"
    (tmp_path / "a.yaml").write_text(body + field)
    with pytest.raises(DatabaseError, match=why):
        load(str(tmp_path))


def test_a_signature_file_that_is_not_utf8_is_a_one_line_error(tmp_path):
    from diagnose.db import DatabaseError, load

    (tmp_path / "a.yaml").write_bytes(b"schema_version: 1\nsignatures:\n  - id: MB-X-001\n    title: \xff\xfe\n")
    with pytest.raises(DatabaseError, match="not UTF-8"):
        load(str(tmp_path))
