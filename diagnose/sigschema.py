"""The JSON Schema of a signature file, built from the loader's own vocabulary (db.py's field
sets, model.py's categories, severities, roles, scopes and safety levels), so an editor can
validate a file as it is written. ``signatures/schema.json`` is this, committed (a test checks
it is current: ``diagnose signatures export --schema > signatures/schema.json``), and each
signature file names it in its first line for YAML language servers.

The schema says what a file looks like; the loader (db.py) says more: regexes compile and are
safe, predicates parse, ids are unique, references resolve, examples match.
"""
from __future__ import annotations

import json

from . import db as DB
from .model import CATEGORIES, ROLES, SAFETY, SCOPES, SEVERITIES

SCHEMA_ID = "urn:megatron-diagnose:signature-file:1"
HEADER = "# yaml-language-server: $schema=./schema.json"

_STR = {"type": "string", "minLength": 1}
_NAMES = {"type": "array", "items": _STR}
_CASE = {"oneOf": [
    {"type": "string"},
    {"type": "object", "additionalProperties": False, "anyOf": [{"required": ["line"]}, {"required": ["log"]},
                                                                 {"required": ["config"]}],
     "properties": {"line": {"type": "string"}, "log": {"type": "string"}, "config": {"type": "object"},
                    "baseline_ms": {"type": "number"}}},
]}


def schema() -> dict:
    match_props = {"anchors": {"oneOf": [_STR, {"type": "array", "items": _STR, "minItems": 1}]},
                   "regex": {"type": "string"}, "captures_when": {"type": "string"}}
    match = {"type": "object", "additionalProperties": False, "properties": match_props}
    sig_props: dict[str, dict] = {
        "id": {"type": "string", "pattern": r"^MB-[A-Z]+-\d{3}$"},
        "slug": {"type": "string", "pattern": r"^[a-z0-9]+(-[a-z0-9]+)*$"},
        "title": _STR,
        "category": {"enum": list(CATEGORIES)},
        "severity": {"enum": list(SEVERITIES)},
        "role": {"enum": list(ROLES)},
        "scope": {"enum": list(SCOPES), "default": "line"},
        "match": match,
        "cause": _STR,
        "confirm": {"oneOf": [{"type": "string"}, {"type": "object", "additionalProperties": False,
                                                   "properties": {"text": {"type": "string"},
                                                                  "when": {"type": "string"}}}]},
        "fixes": {"type": "array", "items": {"oneOf": [{"type": "string"}, {
            "type": "object", "required": ["text"], "additionalProperties": False, "properties": {
                "text": _STR,
                "safety": {"enum": list(SAFETY)},
                "edits": {"type": "array", "items": {
                    "type": "object", "required": ["key"], "additionalProperties": False, "properties": {
                        "key": _STR, "op": {"enum": sorted(DB._EDIT_OPS), "default": "set"}, "value": {},
                        "max": {"type": "number"}, "min": {"type": "number"}}}},
                "compute": _STR, "when": {"type": "string"}, "effect": {"type": "string"}}}]}},
        "references": {"type": "array", "items": {"oneOf": [{"type": "string"}, {"type": "object"}]}},
        "applies": {"type": "object", "additionalProperties": {"type": ["string", "number"]}},
        "tests": {"type": "object", "required": ["match"], "additionalProperties": False, "properties": {
            "match": {"type": "array", "items": _CASE, "minItems": 1},
            "no_match": {"type": "array", "items": _CASE}}},
        "priority": {"type": "integer", "minimum": -1000, "maximum": 1000, "default": 50},
        "supersedes": _NAMES, "demoted_by": _NAMES, "refines": _NAMES, "aliases": _NAMES, "tags": _NAMES,
        "metric": {"type": "string"},
        "preflight": {"type": "boolean"},
        "version": {"type": "integer", "minimum": 1},
        "last_verified": {"type": ["string", "null"]},
    }
    assert set(sig_props) == DB._SIG_FIELDS, set(sig_props) ^ DB._SIG_FIELDS  # one vocabulary
    assert set(match_props) == DB._MATCH_FIELDS
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "diagnose signature file",
        "description": "A family of failure signatures (signatures/README.md). Generated from diagnose/db.py "
                       "and diagnose/model.py by `diagnose signatures export --schema`.",
        "type": "object",
        "required": ["schema_version", "signatures"],
        "additionalProperties": False,
        "properties": {
            "schema_version": {"const": DB.SCHEMA_VERSION},
            "signatures": {"type": "array", "items": {
                "type": "object", "additionalProperties": False,
                "required": ["id", "slug", "title", "category", "severity", "role", "cause", "tests"],
                "properties": sig_props}},
        },
    }


def text() -> str:
    return json.dumps(schema(), indent=2) + "\n"
