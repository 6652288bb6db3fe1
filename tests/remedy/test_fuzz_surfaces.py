"""Property-based fuzzing of the surfaces test_fuzz.py does not reach (issue 16): the fix planner,
``--follow``'s reader, the settings file and the signature files, with long lines.

Each property says what must hold whatever the input: the planner returns a plan (a cause it
cannot fix is "no fix" with a reason, never an exception); the follower never raises, and the
part of a line it holds back stays under the reader's MAX_LINE; settings and signature files are
either accepted or refused with the documented one-line error. Counts: as in test_fuzz.py, each
property checks it really ran 90 % of its examples.
"""
from __future__ import annotations

import copy
import math
import os
from datetime import date
from pathlib import Path

import yaml
from fuzz_counts import Counts
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from diagnose import db as DB
from diagnose import settings as SET
from diagnose.config.runconfig import RunConfig
from diagnose.launch.follow import Follower
from diagnose.logs.read import MAX_LINE
from diagnose.remedy import plan as PL
from diagnose.remedy import search as SE

FUZZ = dict(deadline=None, database=None, suppress_health_check=list(HealthCheck))
COUNTS = Counts()
REPO = Path(__file__).resolve().parents[2]
SEED = yaml.safe_load((REPO / "fixtures/logs/seed/qwen3_30b_a3b_activation_offload_pp1_oom.yaml").read_text())
_DB = DB.load()
# causes the planner computes or edits for (the ones --fix acts on) and plans on for the seed
FIXABLE = [s for s in _DB.signatures if any(f.edits or f.compute for f in s.fixes)]


_count, _report = COUNTS.count, COUNTS.report


def _one_line(exc: Exception):
    msg = str(exc).strip()
    assert msg and "\n" not in msg and "Traceback" not in msg, msg


LONG = st.integers(1_000, 200_000).map(lambda n: "x" * n)

# ----------------------------------------------------------------------------- the fix planner
SEED_CFG = RunConfig(copy.deepcopy(SEED), "seed.yaml")
FIXABLE = [s for s in FIXABLE
           if (lambda p: p.fixes or p.refused)(PL.plan([s], SEED_CFG, SE.Context(world_size=16, oom=True), True))]

PLAN_KEYS = ["model.num_layers", "model.pipeline_model_parallel_size", "model.tensor_model_parallel_size",
             "model.expert_model_parallel_size", "model.context_parallel_size", "model.num_moe_experts",
             "model.num_attention_heads", "model.num_query_groups", "model.hidden_size", "model.seq_length",
             "model.cpu_offloading", "model.cpu_offloading_num_layers", "model.virtual_pipeline_model_parallel_size",
             "model.sequence_parallel", "optimizer.optimizer_cpu_offload", "optimizer.optimizer_offload_fraction",
             "optimizer.overlap_cpu_optimizer_d2h_h2d", "train.micro_batch_size", "train.global_batch_size",
             "model.vocab_size", "model.ffn_hidden_size", "checkpoint.load", "checkpoint.pretrained_checkpoint"]
HOSTILE_VALUES = st.one_of(
    st.integers(-3, 300), st.sampled_from([0, -1, 10**40, 2**63, True, False, None]),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([float("nan"), 1e308, -0.0, 0.25, 1.0, 1.5]),
    st.text(max_size=12), LONG, st.just(date(2026, 12, 2)), st.lists(st.integers(-2, 8), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2))
PLAUSIBLE = st.one_of(st.sampled_from([1, 2, 4, 8, 16, 24, 48, 64, 128]), st.integers(1, 200),
                      st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.0, True, False]))


def _set(d: dict, key: str, value):
    *parents, last = key.split(".")
    for p in parents:
        if not isinstance(d.get(p), dict):
            d[p] = {}
        d = d[p]
    d[last] = value


N_PLANNER = 250


@settings(max_examples=N_PLANNER, **FUZZ)
@given(twists=st.lists(st.tuples(st.sampled_from(PLAN_KEYS), st.one_of(PLAUSIBLE, PLAUSIBLE, PLAUSIBLE,
                                                                        HOSTILE_VALUES)), max_size=4),
       causes=st.lists(st.sampled_from(FIXABLE), min_size=1, max_size=3),
       world=st.sampled_from([None, 0, 1, 3, 8, 16, 16, 16, 32, 10**6]), oom=st.booleans(), unsafe=st.booleans(),
       need=st.sampled_from([None, 0.0, 12.5, float("nan"), 1e30]))
def _prop_planner(twists, causes, world, oom, unsafe, need):
    _count("planner")
    data = copy.deepcopy(SEED)
    for key, value in twists:
        _set(data, key, value)
    cfg = RunConfig(data, "fuzz.yaml")
    ctx = SE.Context(world_size=world, oom=oom, observed_need_gb=need)
    p = PL.plan(causes, cfg, ctx, allow_unsafe=unsafe)
    assert len(p.fixes) + len(p.refused) + len(p.no_fix) + len(p.advice) >= 1 or not causes
    PL.describe(p)
    PL.to_json(p)
    if p.fixes or p.refused:
        _count("planner_planned")
    for fx in p.fixes:  # what would be written is a plain override, one line each
        for e in fx.edits:
            assert isinstance(e.key, str) and "\n" not in e.key


def test_fuzz_planner():
    _prop_planner()
    _report("planner", N_PLANNER)
    # not only refusals of a broken config: the planner really planned on many of them
    assert COUNTS.get("planner_planned", 0) >= 0.1 * N_PLANNER, COUNTS


# ----------------------------------------------------------------------------- --follow's reader

FOLLOW_LINES = [b"[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n",
                b" iteration       10/     100 | elapsed time per iteration (ms): 996.3 | lm loss: 2.0 |\n",
                b"Traceback (most recent call last):\n", b'  File "x.py", line 1, in f\n', b"RuntimeError: boom\n",
                b"\x1b[31m", b"\r", b"\x00", b"\xff\xfe", b"NCCL WARN", b"\n"]
op = st.one_of(
    st.tuples(st.just("append"), st.lists(st.one_of(st.sampled_from(FOLLOW_LINES), st.binary(max_size=64)),
                                          max_size=12).map(b"".join)),
    st.tuples(st.just("long"), st.integers(1, 3 * MAX_LINE)),  # a line without its newline, up to 3 MB
    st.tuples(st.just("truncate"), st.floats(0, 1)),
    st.tuples(st.just("replace"), st.sampled_from(FOLLOW_LINES)),
    st.tuples(st.just("delete"), st.just(b"")))

N_FOLLOW = 120


@settings(max_examples=N_FOLLOW, **FUZZ)
@given(ops=st.lists(op, min_size=1, max_size=8))
def _prop_follow(tmp_path_factory, ops):
    _count("follow")
    path = tmp_path_factory.mktemp("follow") / "run.log"
    path.write_bytes(b"")
    fo = Follower(path, db=_DB)
    for kind, arg in ops:
        if kind == "append":
            with open(path, "ab") as fh:
                fh.write(arg)
        elif kind == "long":
            with open(path, "ab") as fh:
                fh.write(b"y" * arg)
        elif kind == "truncate" and path.exists():
            os.truncate(path, int(path.stat().st_size * arg))
        elif kind == "replace":
            tmp = path.with_suffix(".new")
            tmp.write_bytes(arg)
            os.replace(tmp, path)
        elif kind == "delete" and path.exists():
            path.unlink()
        fo.poll()
        assert len(fo.carry) < MAX_LINE
    rep = fo.report()
    assert rep.lines_read >= 0


def test_fuzz_follow(tmp_path_factory):
    _prop_follow(tmp_path_factory)
    _report("follow", N_FOLLOW)


# ----------------------------------------------------------------------------- settings files

SETTING_KEYS = sorted(SET.KEYS) + ["launch_cmd", "bananas", "tool", ""]
toml_value = st.one_of(
    st.integers(-5, 10**30).map(str), st.floats(allow_nan=True, allow_infinity=True).map(
        lambda f: "nan" if math.isnan(f) else ("inf" if f == math.inf else "-inf" if f == -math.inf else repr(f))),
    st.sampled_from(['"local"', '"slurm"', '"H100"', "true", "false", '""', "[]", '["--partition=gpu"]', "[1, 2]",
                     "{a = 1}", "1979-05-27", '"""x\ny"""', "'q'", '"\\u0000"']),
    st.text(max_size=20).map(lambda s: '"' + s.replace("\\", "").replace('"', "") + '"'),
    LONG.map(lambda s: '"' + s + '"'))
toml_line = st.one_of(st.tuples(st.sampled_from(SETTING_KEYS), toml_value).map(lambda kv: f"{kv[0]} = {kv[1]}"),
                      st.sampled_from(["[tool.diagnose]", "[tool]", "[other]", "= 1", "[[x]]", "#", "x ="]),
                      st.text(max_size=30))

N_SETTINGS = 600


@settings(max_examples=N_SETTINGS, **FUZZ)
@given(lines=st.lists(toml_line, max_size=8), name=st.sampled_from(["diagnose.toml", ".diagnose.toml",
                                                                    "pyproject.toml"]),
       raw=st.one_of(st.none(), st.binary(max_size=40)))
def _prop_settings(tmp_path_factory, lines, name, raw):
    _count("settings")
    folder = tmp_path_factory.mktemp("settings")
    text = "\n".join(lines).encode("utf-8", "surrogatepass")
    (folder / name).write_bytes(text if raw is None else raw + text)
    try:
        s = SET.find(folder)
    except SET.SettingsError as exc:
        _one_line(exc)
        return
    for key, value in s.values.items():  # whatever was accepted has the documented type
        what, ok = SET.TYPES[key]
        assert ok(value), (key, value, what)


def test_fuzz_settings(tmp_path_factory):
    _prop_settings(tmp_path_factory)
    _report("settings", N_SETTINGS)


# ----------------------------------------------------------------------------- signature files

SIG_FIELDS = ["id", "slug", "title", "category", "severity", "role", "scope", "priority", "match", "cause",
              "confirm", "fixes", "references", "tags", "tests", "metric", "supersedes", "refines", "demoted_by",
              "aliases", "versions", "bananas"]
field_value = st.one_of(HOSTILE_VALUES, st.sampled_from(
    [{"anchors": ["x"], "regex": "(a+)+"}, {"anchors": []}, {"anchors": "CUDA"}, {"regex": 5}, {"regex": "("},
     [{"text": "t", "edits": [{"key": "a.b", "op": "explode"}]}], [{"text": "t", "safety": "maybe"}],
     {"match": ["x"]}, {"match": [{"line": 1}]}, "high", "MB-XX-1", "not-a-category", ["MB-NOPE-001"],
     {"when": "model. =="}, "metrics.x >"]))

N_SIGFILES = 300
BASE_SIG = next(s for s in yaml.safe_load((REPO / "signatures/oom.yaml").read_text())["signatures"])


@settings(max_examples=N_SIGFILES, **FUZZ)
@given(edits=st.lists(st.tuples(st.sampled_from(SIG_FIELDS), st.one_of(field_value, st.just("__drop__"))),
                      min_size=1, max_size=4),
       version=st.sampled_from([1, 1, 2, "1", None]), raw=st.one_of(st.none(), st.binary(max_size=30)))
def _prop_signature_file(tmp_path_factory, edits, version, raw):
    _count("signature_file")
    folder = tmp_path_factory.mktemp("sigs")
    sig = copy.deepcopy(BASE_SIG)
    for key, value in edits:
        if value == "__drop__":
            sig.pop(key, None)
        else:
            sig[key] = value
    try:
        text = yaml.safe_dump({"schema_version": version, "signatures": [sig]}, allow_unicode=True)
    except yaml.YAMLError:
        return  # not expressible in YAML (a date inside a key ...): nothing to load
    data = text.encode("utf-8", "surrogatepass")
    (folder / "user.yaml").write_bytes(data if raw is None else raw + data)
    try:
        db = DB.load(str(folder))
    except DB.DatabaseError as exc:
        _one_line(exc)
        return
    assert len(db.signatures) == 1


def test_fuzz_signature_files(tmp_path_factory):
    _prop_signature_file(tmp_path_factory)
    _report("signature_file", N_SIGFILES)


def test_a_hostile_signature_file_is_refused_in_one_line_by_the_cli(run_cli, tmp_path):
    """Through the command line too: exit 2 and one line, for a regex that backtracks."""
    sig = copy.deepcopy(BASE_SIG)
    sig["match"] = {"anchors": ["boom"], "regex": r"boom(\s|\s)+!"}
    (tmp_path / "user.yaml").write_text(yaml.safe_dump({"schema_version": 1, "signatures": [sig]}))
    log = tmp_path / "run.log"
    log.write_text("boom\n")
    code, _, err = run_cli(str(log), "--signatures", str(tmp_path))
    assert code == 2, err
    assert "overlap" in err and len(err.strip().splitlines()) == 1, err
