"""Top-1 accuracy on the labelled real logs in ../shared/real-logs-dev (skipped where absent)."""
import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FOLDER = REPO.parent / "shared" / "real-logs-dev"


@pytest.mark.skipif(not (FOLDER / "labels.json").is_file(), reason="../shared/real-logs-dev is not beside the repo")
def test_real_logs_accuracy():
    spec = importlib.util.spec_from_file_location("eval_real_logs", REPO / "bench" / "eval_real_logs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    res = mod.evaluate(FOLDER)
    misses = [(r["file"], r["expected"], r["got"]) for r in res["rows"] if not r["correct"]]
    assert res["healthy_flagged"] == 0, misses
    assert res["correct"] >= 14, misses
