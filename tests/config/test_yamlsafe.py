"""diagnose/yamlsafe.py: a YAML document is sized once per distinct node, exactly, before anything
walks it; an alias that refers to itself is named as such."""
from __future__ import annotations

import pytest
import yaml

from diagnose import yamlsafe
from diagnose.yamlsafe import YamlBomb, check_expansion


@pytest.mark.parametrize("n, refused", [(9, False), (10, True)])
def test_the_values_are_counted_exactly(monkeypatch, n, refused):
    """A list of n scalars is n + 1 values; more than MAX_VALUES is refused, MAX_VALUES itself is not."""
    monkeypatch.setattr(yamlsafe, "MAX_VALUES", 10)
    doc = list(range(n))
    if refused:
        with pytest.raises(YamlBomb, match="more than 10 values"):
            check_expansion(doc, "c.yaml")
    else:
        check_expansion(doc, "c.yaml")


def test_an_alias_used_twice_counts_twice_but_is_sized_once(monkeypatch):
    monkeypatch.setattr(yamlsafe, "MAX_VALUES", 12)
    doc = yaml.safe_load("a: &x [1, 2, 3, 4, 5]\nb: *x\n")  # 1 + (1 + 5) * 2 = 13 values
    with pytest.raises(YamlBomb, match="more than 12 values"):
        check_expansion(doc, "c.yaml")
    monkeypatch.setattr(yamlsafe, "MAX_VALUES", 13)
    check_expansion(doc, "c.yaml")


def test_a_self_referencing_alias_is_named():
    doc = yaml.safe_load("a: &x [1, *x]\n")
    with pytest.raises(YamlBomb, match=r"c\.yaml: a YAML alias refers to itself"):
        check_expansion(doc, "c.yaml")


def test_nesting_too_deep_is_refused_not_a_crash():
    doc: list = []
    cur = doc
    for _ in range(5000):
        cur.append([])
        cur = cur[0]
    with pytest.raises(YamlBomb, match="nested too deeply"):
        check_expansion(doc, "c.yaml")
