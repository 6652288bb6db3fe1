"""signatures/schema.json: the JSON Schema of a signature file, generated from the loader's own
vocabulary (diagnose/sigschema.py); current, met by every file of the database, named in each
file's first line for editors, and never stricter than the loader."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from diagnose import db as DB
from diagnose import sigschema

REPO = Path(__file__).resolve().parents[2]
SIGS = REPO / "signatures"
FILES = sorted(SIGS.glob("*.yaml"))
VALIDATOR = jsonschema.Draft202012Validator(json.loads((SIGS / "schema.json").read_text()))


def test_the_committed_schema_is_current(run_cli):
    assert (SIGS / "schema.json").read_text() == sigschema.text()
    code, out, _ = run_cli("signatures", "export", "--schema")
    assert code == 0 and json.loads(out) == sigschema.schema()
    jsonschema.Draft202012Validator.check_schema(sigschema.schema())


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_every_signature_file_meets_the_schema_and_names_it(path):
    text = path.read_text()
    assert text.splitlines()[0] == sigschema.HEADER
    errors = [f"{list(e.path)}: {e.message}" for e in VALIDATOR.iter_errors(yaml.safe_load(text))]
    assert not errors, errors[:5]


BASE = yaml.safe_load((SIGS / "oom.yaml").read_text())["signatures"][0]
# what an author gets wrong: each is refused by the schema (in the editor) and by the loader
MISTAKES = {
    "priority as a word": ("priority", "high"),
    "unknown category": ("category", "gpu_oom"),
    "misspelt field": ("cauze", "x"),
    "tags as a word": ("tags", "oom"),
    "confirm as a number": ("confirm", 1),
    "fixes as a mapping": ("fixes", {"text": "x"}),
    "edit with an unknown op": ("fixes", [{"text": "x", "edits": [{"key": "a.b", "op": "explode"}]}]),
    "fix with an unknown safety": ("fixes", [{"text": "x", "safety": "maybe"}]),
    "no examples": ("tests", {"no_match": ["x"]}),
    "regex as a number": ("match", {"anchors": ["x"], "regex": 5}),
    "bad id": ("id", "MB-OOM-1"),
    "slug in capitals": ("slug", "Cuda-OOM"),
    "version zero": ("version", 0),
}


@pytest.mark.parametrize("name", sorted(MISTAKES))
def test_schema_and_loader_refuse_the_same_mistakes(tmp_path, name):
    key, value = MISTAKES[name]
    sig = copy.deepcopy(BASE)
    sig[key] = value
    doc = {"schema_version": 1, "signatures": [sig]}
    assert list(VALIDATOR.iter_errors(doc)), f"the schema accepts: {name}"
    (tmp_path / "user.yaml").write_text(yaml.safe_dump(doc))
    with pytest.raises(DB.DatabaseError):
        DB.load(str(tmp_path))


def test_the_signature_docs_are_the_database_s(run_cli):
    """docs/signatures.md is generated (diagnose signatures export --markdown): never stale."""
    code, out, _ = run_cli("signatures", "export", "--markdown")
    assert code == 0
    docs = (Path(__file__).resolve().parents[2] / "docs" / "signatures.md").read_text(encoding="utf-8")
    assert out == docs, "docs/signatures.md is stale: diagnose signatures export --markdown > docs/signatures.md"
    db = DB.load()
    for s in db.signatures:  # every signature is there, under its category
        assert f"### {s.id} `{s.slug}`" in docs
