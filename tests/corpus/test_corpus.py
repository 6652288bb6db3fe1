"""The real-log corpus (fixtures/corpus): its integrity, the accuracy floors of both parts, and one
test per evidence layer built from the corpus's own real logs.

The corpus is split by source repository (bench/eval_real_logs.py ``part_of``): rules are written
from the dev part only; the test part is only scored. The floors below are the measured numbers
(bench/README.md) minus nothing: a change that loses a log fails here.
"""
import importlib.util
import json
from pathlib import Path

import pytest

from diagnose.diagnosis import diagnose_paths
from diagnose.model import CATEGORIES

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "fixtures" / "corpus"
RESERVED = REPO.parent / "shared" / "eval" / "reserved-sources.txt"


def _eval_module():
    spec = importlib.util.spec_from_file_location("eval_real_logs", REPO / "bench" / "eval_real_logs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


EVAL = _eval_module()


def _labels():
    for folder in EVAL.labelled_folders(CORPUS):
        for lab in json.loads((folder / "labels.json").read_text(encoding="utf-8")):
            yield folder, lab


def _norm(url: str) -> str:
    return url.strip().rstrip("/").split("#")[0].lower()


def test_corpus_labels_are_complete_and_the_evidence_is_in_the_log():
    labels = list(_labels())
    assert len(labels) >= 270
    sources = [_norm(lab["source"]) for _, lab in labels]
    assert len(sources) == len(set(sources)), "one log per thread"
    for folder, lab in labels:
        assert lab["root_cause"] in CATEGORIES + ("healthy",), lab
        assert lab["source"].startswith("https://github.com/"), lab
        lines = (folder / lab["file"]).read_text(encoding="utf-8", errors="replace").splitlines()
        assert 1 <= lab["root_cause_line"] <= len(lines) and lines[lab["root_cause_line"] - 1].strip(), (
            folder.name, lab["file"])
        assert "root_cause_evidence" not in lab  # the text lives in the log only
    logs = {p.relative_to(CORPUS).as_posix() for p in CORPUS.glob("*/*.log")}
    assert logs == {f"{folder.name}/{lab['file']}" for folder, lab in labels}, "every log labelled, every label a log"


@pytest.mark.skipif(not RESERVED.is_file(), reason="../shared/eval is not beside the repo")
def test_no_reserved_thread_in_the_corpus():
    reserved = {_norm(u) for u in RESERVED.read_text().splitlines() if u.strip() and not u.startswith("#")}
    used = {_norm(lab["source"]) for _, lab in _labels()}
    assert not reserved & used


def test_both_parts_are_split_by_repository():
    parts = {}
    for _, lab in _labels():
        repo = EVAL.repo_of(lab).lower()
        parts.setdefault(repo, set()).add(EVAL.part_of(repo))
    assert all(len(p) == 1 for p in parts.values())
    counts = {p: sum(1 for _, lab in _labels() if EVAL.part_of(EVAL.repo_of(lab)) == p) for p in ("dev", "test")}
    assert counts["test"] >= 100 and counts["dev"] >= 150, counts


def test_the_seen_list_names_test_part_logs_only():
    """fixtures/corpus/test-seen.txt: test-part logs read by mistake while writing rules; each
    entry must be a labelled test-part log (the score is also printed without them)."""
    seen = EVAL.seen_test_logs(CORPUS)
    parts = {f"{folder.name}/{lab['file']}": EVAL.part_of(EVAL.repo_of(lab)) for folder, lab in _labels()}
    assert seen and all(parts.get(name) == "test" for name in seen), {n: parts.get(n) for n in seen}


# measured (bench/README.md "Generalization"); the target is 0.90 on the test part. The
# test floor went from 0.62 to 0.61 when round 8 added 20 test-part logs scored 8/20 blind (the
# part's score is what it is: it is never tuned); round 11 and its rules: dev 79.1 %, test 62.7 %
FLOORS = {"dev": 0.78, "test": 0.62}


@pytest.mark.parametrize("part", ["dev", "test"])
def test_corpus_accuracy_floor_and_no_false_alarm(part):
    res = EVAL.evaluate(CORPUS, part)
    misses = [(r["slice"], r["file"], r["expected"], r["got"]) for r in res["rows"] if not r["correct"]]
    assert res["healthy_flagged"] == 0, [m for m in misses if m[2] == "healthy"]
    assert res["correct"] / res["total"] >= FLOORS[part], (res["correct"], res["total"])


# one real log (dev part) per evidence layer: (file, category, basis)
LAYER_CASES = [
    # cut / wrapped line: the known message survives, the regex does not match the whole line
    ("cn-stack/003_colossalai-import-nullcontext.log", "import_error", "anchor"),
    # exception read by type + message keywords: any accelerator's OOM, a Ray-wrapped type
    ("nemo-bridge/002_ppo-default-yaml-dtensor-oom.log", "cuda_oom", "exception"),
    ("te-torch/025_flash-attn3-hopper-unsupported-head-size.log", "config_other", "exception"),
    ("nemo-bridge/013_nemorl-dpo-microbatch-not-multiple.log", "config_divisibility", "exception"),
    # traceback without its last line: the frames name the kind of failure
    ("verl-rl/024_verl-megatron-qwen3-32b-hf-to-mcore-load.log", "checkpoint_error", "traceback"),
    ("te-torch/002_te-pytorch-load-library-stopiteration.log", "import_error", "traceback"),
    # what the job was doing: a traceback (cut) right after "saving checkpoint at iteration ..."
    ("cn-stack/018_swift-qwen3vl-save-ckpt-torch-dist.log", "checkpoint_error", "context"),
    # failures outside Python: Ray's memory monitor, mpirun, Open MPI's banner, torchrun's agent
    ("cn-stack/002_slime-ray-oom-ckpt-save.log", "host_oom", "wrapper"),
    ("ds-misc/005_ompi-npb-rank-killed-signal9.log", "host_oom", "wrapper"),
    ("ds-misc/028_torchpack-mpirun-orte-daemons.log", "other", "wrapper"),
    ("ds-misc/004_accelerate-llama30b-load-exitcode-9.log", "host_oom", "wrapper"),
    # no error line: the fp16 loss scale collapsing
    ("megatron-lm/019_amp-o1-loss-scale-collapse.log", "loss_nan", "symptom"),
    # no error line: every file's output stops in distributed start-up (Lightning, DeepSpeed
    # pipeline set-up, NCCL channel set-up)
    ("r3-general/024_lightning-ddp-stuck-after-all-processes-registered.log", "hang", "symptom"),
    ("ds-misc/020_neox-20b-stuck-after-pipe-init.log", "hang", "symptom"),
    ("r3-general/007_transformers-trainer-multigpu-hang-nccl-p2p-ipc.log", "hang", "symptom"),
    # a tensor on the wrong device is a code bug, not the accelerator failing
    ("megatron-lm/024_fused-adam-p-copy-not-cuda.log", "other", "exception"),
    # the frames only: a rollout engine's wake_up (vLLM sleep mode) re-allocating its memory
    ("verl-rl/003_verl-vllm-wakeup-cumem-oom.log", "cuda_oom", "traceback"),
    # an asserted equal split is divisibility, whatever else the message says
    ("r3-rl/026_verl-agent-loop-chunk-60-by-8.log", "config_divisibility", "exception"),
    # frames only: a traceback cut inside flash-attn's binding; inside pip's build of apex
    ("te-torch/019_flash-attn-2-backward-illegal-memory-access-varlen.log", "cuda_error", "traceback"),
    ("r4-nvidia/014_apex-torch110-cu113-ninja-build.log", "import_error", "traceback"),
    # Ascend: HCCL's socket timeout, a consequence like NCCL's watchdog
    ("r4-rl/028_llamafactory-910b3-ppo-after-reward-model.log", "nccl_timeout", "cascade"),
    # round 5 (dev part): HF Trainer's start banner with nothing after it; a traceback cut in
    # DeepSpeed's engine set-up (the model put on the device); the loss jumping to random level
    ("r5-general/013_hf-trainer-deepspeed-bittensor-dataset-hang.log", "hang", "symptom"),
    ("r5-general/018_accelerate-deepspeed-multinode-oom-at-prepare-cut.log", "cuda_oom", "traceback"),
    ("r5-general/019_gpt-neox-llama-bf16-loss-jumps-after-step1.log", "loss_nan", "symptom"),
    ("memory/001_te-cudagraph-capture-oom-cut.log", "cuda_oom", "traceback"),
    # cut in an apex module's __init__ (its CUDA extension); NCCL's optional net plugin not found
    # is an INFO line, not a missing library: the output stops in NCCL set-up
    ("r5-nvidia/007_apex-fused-layer-norm-cuda-missing-at-model-init.log", "import_error", "traceback"),
    ("r5-nvidia/011_nccl-fsdp-example-hang-before-training-loop.log", "hang", "symptom"),
    # round 6 (dev part): a world size that is not the product of the parallel sizes; a traceback
    # cut in a rollout engine's sleep (weights into pinned host memory); one rank's unknown
    # error before every other rank's watchdog timeout is the cause, not the timeouts
    ("r6-config-import-nan/004_ms-swift-grpo-world-size-not-equal-tp-x-pp.log", "config_divisibility", "exception"),
    ("r6-memory-speed/019_verl-vllm-sleep-pin-memory-allocation-cut.log", "host_oom", "traceback"),
    ("r6-dist-ckpt/021_trlx-ppo-rank-crash-then-watchdog-timeouts.log", "other", "exception"),
    # a traceback cut at the schedule's call of finalize_model_grads (Megatron's NaN check of
    # the gradient buckets)
    ("runtime/008_slime-qwen3-32b-unexpected-nan-frames.log", "loss_nan", "traceback"),
    # round 7 (dev part): a NaN loss in nanoGPT's iteration line (no colon); the fp16 loss scale
    # collapsing in DLLogger's parameter lines; an NCCL internal error whose line lost its start;
    # the DeepSpeed launcher's return code -7 (SIGBUS: /dev/shm); NCCL's shared memory segment
    # (host memory, not the network); a traceback cut in the HF Trainer's resume (rng state)
    ("r7-hang-slow/007_nanogpt-gpt2-fp16-v100-loss-nan-after-iter3000.log", "loss_nan", "signature"),
    ("r7-hang-slow/015_dle-bert-pytorch-amp-loss-scale-collapse.log", "loss_nan", "symptom"),
    ("r7-runtime/009_lightning-nccl-internal-error-connection-closed.log", "nccl_error", "signature"),
    ("r7-runtime/013_gpt-neox-deepspeed-launcher-sigbus-exit-7.log", "host_oom", "signature"),
    ("r7-runtime/018_transformers-deepspeed-nccl-shm-segment-failed.log", "host_oom", "signature"),
    ("r7-setup-memory/021_nccl-horovod-docker-dev-shm-posix-fallocate-no-space.log", "host_oom", "signature"),
    ("r7-setup-memory/005_ms-swift-resume-from-checkpoint-load-rng-state.log", "checkpoint_error", "traceback"),
    # fairseq's epoch summary with loss_scale 0.000 (below what it prints); DeepSpeed's report of
    # 1995 skipped steps out of 2000 glued to a tqdm bar
    ("r4-general/016_fairseq-transformer-zh-en-fp16-epoch28.log", "loss_nan", "symptom"),
    ("ds-misc/018_hf-t5-11b-ds-loss-zero-skipped.log", "loss_nan", "symptom"),
    # round 8 (dev part): torch.multinomial's NaN probabilities (an RL rollout); a c10d store
    # socket that timed out in a weight-update group; DDP's parameter marked ready twice; an
    # assertion that a model's weights were not loaded
    ("r8-rl/014_swift-grpo-kl-nan-multinomial-assert.log", "loss_nan", "signature"),
    ("r8-rl/019_openr1-vllm-server-weight-sync-socket-timeout-collective-rpc.log", "nccl_timeout", "signature"),
    ("r8-general/018_transformers-trainer-lora-ddp-variable-marked-ready-twice.log", "config_other", "signature"),
    ("r8-rl/008_llamafactory-ppo-reward-model-valuehead-not-loaded.log", "checkpoint_error", "exception"),
    # a traceback cut in a resume function (xtuner's load_or_resume); an unknown error right
    # after Megatron-LM's "loading release checkpoint from ..."
    ("config-ckpt/027_xtuner-resume-iter-pth-deepspeed.log", "checkpoint_error", "traceback"),
    ("config-ckpt/002_rlinf-extra-state-missing.log", "checkpoint_error", "context"),
    # round 9 (dev part): Ray's memory-kill report cut after its first words; a traceback cut in
    # MCore's sharded_state_dict (the optimizer's checkpoint shards); FP8 asked of a GPU below
    # sm89 (a setting, not the device); torchrun not on the PATH of the job's shell
    ("r9-memory-numerics/006_llamafactory-ray-host-oom-after-training-405b-offload.log", "host_oom", "wrapper"),
    ("r9-setup/005_slime-save-ckpt-distrib-optimizer-shape-assert.log", "checkpoint_error", "traceback"),
    ("r9-setup/012_transformerengine-fp8-on-ampere-rtx3090.log", "config_other", "exception"),
    ("r9-distributed/012_llamafactory-multinode-sudo-torchrun-not-found.log", "config_other", "signature"),
    # output that stops before a first step, warnings after it: Lightning's sanity-check bar at
    # 0/?, an epoch bar at 0/N with a UserWarning and its source line after it, composer's
    # "Spinning the dataloaders" with a streaming WARNING after it
    ("nemo-bridge/007_llama2-sft-pp2-hang-sanity-check.log", "hang", "symptom"),
    ("r7-hang-slow/005_opensora-colossalai-stuck-epoch0-jit-cpu-adam.log", "hang", "symptom"),
    ("ds-misc/006_llmfoundry-stuck-spinning-dataloaders.log", "hang", "symptom"),
    # round 10: output that stops in a ninja extension build (a stale build lock); in DeepSpeed's
    # activation-checkpointing lines of the first forward pass (host-prefixed lines)
    ("r10-hang-slow/015_modelscope-megatron-util-stuck-compiling-fused-kernels-lock.log", "hang", "symptom"),
    ("r10-hang-slow/007_gpt-neox-mp2-hang-after-activation-checkpointing-info.log", "hang", "symptom"),
    # output that stops in an RL job's weight hand-over to its rollout engine: vLLM's prefix
    # cache reset (TRL; ms-swift with finished preprocessing bars after it), its CuMem sleep
    # (NeMo-RL, Ray-prefixed), TRL vllm-serve's /update_named_param/ requests
    ("r7-hang-slow/017_trl-grpo-vllm-colocate-peft-hang-after-step6.log", "hang", "symptom"),
    ("r7-hang-slow/008_ms-swift-grpo-lora-colocate-hang-at-rollout.log", "hang", "symptom"),
    ("r4-nvidia/011_nemorl-gym-grpo-qwen3-32b-step2-save.log", "hang", "symptom"),
    ("r8-rl/007_trl-vllm-serve-stuck-after-weight-update-hang.log", "hang", "symptom"),
    # round 11 (dev part): output that stops after "| distributed init (rank N): tcp://..."
    # (fairseq and the DeiT / MAE family print it before init_process_group); NCCL set-up lines
    # whose last line the paste cut mid-way; NCCL retrying a connection to its peer
    ("r11-general/001_fairseq-8gpu-v100-stuck-after-distributed-init-hours.log", "hang", "symptom"),
    ("r11-nvidia/015_nccl-tests-allreduce-4x1080ti-p2p-hang-after-affinity.log", "hang", "symptom"),
    ("r3-general/030_fairseq-2node-nccl-connect-refused-retrying.log", "nccl_error", "symptom"),
    # a py-spy dump whose thread ids are 0x-hex (newer py-spy); a log viewer's table (Grafana /
    # Loki rows, newest first) whose cells frame each line
    ("r11-rl/006_swift-sft-qwen25vl-hang-pyspy-decord-video-read.log", "hang", "cascade"),
    ("r11-rl/005_swift-grpo-trl-import-vllm-ascend-on-cuda-reversed-log.log", "import_error", "exception"),
    # a traceback cut in a split across ranks (ColossalAI's split_tensor_3d), and one whose paste
    # began mid-line (a headless first fragment cut in forward_step: MB-GEN-025's guess) and goes
    # on to a source line dividing by the context-parallel size: the specific reading wins
    ("r11-general/006_colossalai-gpt2-3d-split-tensor-not-multiple-of-world-size.log", "config_divisibility", "traceback"),
    ("r11-nvidia/012_nemo-sft-packed-cp2-get-batch-on-cp-rank-2cp-split-cut.log", "config_divisibility", "traceback"),
]


@pytest.mark.parametrize("rel,category,basis", LAYER_CASES, ids=[c[0] for c in LAYER_CASES])
def test_each_layer_on_a_real_log(rel, category, basis):
    repo = next(lab for folder, lab in _labels() if f"{folder.name}/{lab['file']}" == rel)
    assert EVAL.part_of(EVAL.repo_of(repo)) == "dev", "layer tests come from the dev part"
    rc = diagnose_paths([str(CORPUS / rel)], jobs=1).root_cause
    assert rc is not None
    assert (rc.finding.signature.category, rc.basis) == (category, basis), (rc.finding.signature.id, rc.hit.text)


def _watchdog_line() -> str:
    """A real NCCL watchdog line from the dev part of the corpus."""
    text = (CORPUS / "te-torch" / "022_nccl-megatron-reduce-scatter-timeout-no-nccl-error.log").read_text()
    return next(ln for ln in text.splitlines() if "Watchdog caught collective operation timeout" in ln)


def test_a_watchdog_line_cut_at_the_end_of_the_paste_still_counts(tmp_path):
    line = _watchdog_line()
    cut = line[: line.index("Watchdog caught collective operation timeout") + 60]
    log = tmp_path / "cut.log"
    log.write_text(cut)
    rc = diagnose_paths([str(log)], jobs=1).root_cause
    assert rc is not None and rc.finding.signature.id == "MB-NCCL-001" and rc.basis == "anchor"
    # the same cut line in the middle of a log is not a hit: only the paste's last line may be cut
    log.write_text(cut + "\nmore lines after it\n")
    rc = diagnose_paths([str(log)], jobs=1).root_cause
    assert rc is None or rc.finding.signature.id != "MB-NCCL-001"


def test_a_wrapped_watchdog_line_is_joined(tmp_path):
    line = _watchdog_line()
    k = line.index("milliseconds before timing out")
    log = tmp_path / "wrapped.log"
    log.write_text(line[:k] + "\n" + line[k:] + "\nnext\n")
    rc = diagnose_paths([str(log)], jobs=1).root_cause
    assert rc is not None and rc.finding.signature.id == "MB-NCCL-001" and rc.basis == "anchor"


def test_the_straggler_is_the_rank_without_a_watchdog_timeout(tmp_path):
    """Per-rank files: ranks 0-6 report the (real) watchdog line, rank 7's file has none."""
    import re

    line = _watchdog_line()
    body = line[line.index("[E"):] if "[E" in line else line
    for r in range(7):
        (tmp_path / f"rank{r}.log").write_text(re.sub(r"\[Rank \d+\]", f"[Rank {r}]", body) + "\n")
    (tmp_path / "rank7.log").write_text("still computing the forward pass\n")
    rc = diagnose_paths([str(tmp_path)], jobs=1).root_cause
    assert rc.straggler == {"reporting": list(range(7)), "not_reporting": [7], "world_size": 8, "rank": 7}
    assert rc.hit.rank == 7 and rc.rank_source.startswith("straggler")
    # two silent ranks: both named, none singled out
    (tmp_path / "rank6.log").write_text("still computing\n")
    rc = diagnose_paths([str(tmp_path)], jobs=1).root_cause
    assert rc.straggler["not_reporting"] == [6, 7] and rc.straggler["rank"] is None


def test_the_innermost_explicit_rank_wins():
    from diagnose.logs.lines import split_prefix

    assert split_prefix("(worker1, rank=1, pid=4242, ip=10.0.0.2) [rank13]: RuntimeError: x")[0] == 13
    assert split_prefix("(worker1, rank=1, pid=4242, ip=10.0.0.2) RuntimeError: x")[0] == 1
    assert split_prefix("2026-01-09 17:40:31.169213 master-0 >> [rank7]:   File \"a.py\"")[0] == 7


def test_a_traceback_under_an_actor_repr_or_a_loggers_header_is_read():
    """Ray names an actor by its repr ("(ActorWorker(actor_train-1) pid=...)"), and vLLM's
    logger repeats "ERROR 04-07 00:57:46 ray_utils.py:45] " on every line of a logged traceback:
    both are prefixes, and the traceback under them is one traceback (real dev-part logs)."""
    from diagnose.logs.lines import prefix_key, split_prefix

    line = '(RayWorkerVllm pid=7500) ERROR 04-07 00:57:46 ray_utils.py:45]   File "w.py", line 92, in init_device'
    assert split_prefix(line)[1] == '  File "w.py", line 92, in init_device'
    assert prefix_key(line) == "(RayWorkerVllm pid=7500)"
    for rel, frames in (("r4-nvidia/016_nccl-vllm-ppc64le-init-allreduce.log", 4),
                        ("runtime/007_roll-megatron-actor-train-nan-frames.log", 4)):
        tbs = diagnose_paths([str(CORPUS / rel)], jobs=1).structure.tracebacks
        assert len(tbs) == 1 and len(tbs[0].frames) >= frames, (rel, tbs)


def _startup_lines() -> list:
    """Real start-up lines (dev part): Lightning's DDP set-up, with no step after them."""
    text = (CORPUS / "r3-general" / "024_lightning-ddp-stuck-after-all-processes-registered.log").read_text()
    return text.splitlines()


def test_a_start_up_hang_needs_every_rank_file_to_stop_in_start_up(tmp_path):
    lines = _startup_lines()
    for r in range(2):
        (tmp_path / f"rank{r}.log").write_text("\n".join(lines) + "\n")
    rc = diagnose_paths([str(tmp_path)], jobs=1).root_cause
    assert rc is not None and rc.finding.signature.category == "hang"
    # one rank went on to train: the job did not stop in start-up
    (tmp_path / "rank1.log").write_text("\n".join(lines) + "\n{'loss': 0.5311, 'learning_rate': 1e-05, 'epoch': 0.15}\n")
    assert diagnose_paths([str(tmp_path)], jobs=1).root_cause is None


def test_a_start_up_hang_gives_way_to_any_error(tmp_path):
    watchdog = _watchdog_line()
    log = tmp_path / "run.log"
    log.write_text(watchdog + "\n" + "\n".join(_startup_lines()) + "\n")
    rc = diagnose_paths([str(log)], jobs=1).root_cause
    assert rc is not None and rc.finding.signature.category == "nccl_timeout"


def test_the_tail_of_a_big_file_is_its_last_lines_in_pieces_and_gzip(tmp_path, monkeypatch):
    import gzip

    from diagnose import parallel as P
    from diagnose.logs import read as R

    # small chunks and pieces: the last lines span two chunks, and the file is cut in pieces
    monkeypatch.setattr(R, "CHUNK", 48 << 10)
    monkeypatch.setattr(P, "SPLIT_MIN", 512 << 10)

    filler = "".join(f"[2024-01-01 00:00:00] INFO building dataset shard {i} of 20000\n" for i in range(20000))
    body = filler + "\n".join(_startup_lines()) + "\n"
    plain = tmp_path / "big.log"
    plain.write_text(body)
    gz = tmp_path / "big.log.gz"
    gz.write_bytes(gzip.compress(body.encode()))
    n = body.count("\n")
    for path, jobs in ((plain, 1), (plain, 2), (gz, 1)):
        rep = diagnose_paths([str(path)], jobs=jobs)
        assert rep.root_cause is not None and rep.root_cause.finding.signature.id == "MB-SYM-010", (path, jobs)
        assert rep.root_cause.hit.line == n - 1  # the "Starting ddp" line, above the last dashes


def test_the_start_up_lines_are_data_and_a_bad_row_is_refused(tmp_path):
    """The start-up-hang table lives in signatures/layers/startup.yaml; the loader checks it."""
    from diagnose.analyze import layers
    from diagnose.db import default_path

    tables = layers.load_tables(str(default_path()))
    assert tables.startup and tables.startup_line("All DDP processes registered. Starting ddp with 2 processes")
    assert not tables.startup_line("NCCL INFO [Service thread] Connection closed by localRank 2")  # teardown
    for bad in ("startup_lines: [{id: x}]", "startup_lines: [{id: x, regex: '('}]",
                "startup_lines: [{id: x, regex: a, extra: 1}]"):
        d = tmp_path / bad.count("(").__str__() / str(len(bad))
        (d / "layers").mkdir(parents=True)
        (d / "layers" / "startup.yaml").write_text("schema_version: 1\n" + bad + "\n")
        with pytest.raises(layers.LayerError):
            layers.load_tables(str(d))


def test_the_rollout_sync_lines_are_data_and_a_bad_row_is_refused(tmp_path):
    """The weight hand-over table lives in signatures/layers/rollout.yaml; the loader checks it
    as it does the start-up table, and the two tables do not read each other's lines."""
    from diagnose.analyze import layers
    from diagnose.db import default_path

    tables = layers.load_tables(str(default_path()))
    sync = "INFO 06-30 11:57:50 [block_pool.py:264] Successfully reset prefix cache"
    assert tables.rollout_sync_line(sync) and not tables.startup_line(sync)
    assert tables.rollout_sync_line('INFO:     127.0.0.1:52740 - "POST /update_named_param/ HTTP/1.1" 200 OK')
    assert not tables.rollout_sync_line('INFO:     127.0.0.1:52740 - "GET /metrics HTTP/1.1" 200 OK')
    assert not tables.rollout_sync_line("All DDP processes registered. Starting ddp with 2 processes")
    for i, bad in enumerate(("rollout_sync_lines: [{id: x}]", "rollout_sync_lines: [{id: x, regex: '('}]",
                             "rollout_sync_lines: [{id: nccl-info-setup, regex: a}]\nstartup_lines: [{id: nccl-info-setup, regex: b}]")):
        d = tmp_path / str(i)
        (d / "layers").mkdir(parents=True)
        (d / "layers" / "rollout.yaml").write_text("schema_version: 1\n" + bad + "\n")
        with pytest.raises(layers.LayerError):
            layers.load_tables(str(d))


def test_output_that_stops_after_a_finished_bar_still_stops_in_the_weight_sync(tmp_path):
    """A finished progress bar (a short preprocessing loop at N/N) after the engine's prefix-cache
    reset is not progress; a bar still running is, and so is a metrics line after it."""
    head = ("Train:   2%|▏         | 56/2290 [1:41:55<93:10:01, 150.14s/it]\n"
            "INFO 10-10 17:06:36 [block_pool.py:292] Successfully reset prefix cache\n")
    cases = {"100%|██████████| 32/32 [00:00<00:00, 52966.74it/s]\n": "MB-SYM-014",
             " 25%|██▌       | 8/32 [00:00<00:00, 1502.95it/s]\n": None,
             "{'loss': 0.102, 'grad_norm': 0.53, 'epoch': 0.01}\n": None}
    for i, (tail, want) in enumerate(cases.items()):
        log = tmp_path / f"{i}.log"
        log.write_text(head + tail + tail)
        rc = diagnose_paths([str(log)], jobs=1).root_cause
        assert (rc.finding.signature.id if rc else None) == want, tail
        if want:
            assert rc.hit.line == 2 and "reset prefix cache" in rc.hit.text


def test_a_cut_row_reads_only_a_traceback_that_lost_its_exception_line(tmp_path):
    """MB-GEN-025 (a step's compute cut before its exception line) is a suspicion for a cut
    traceback only: the same frames with their exception line are that exception."""
    real = Path(__file__).parents[2] / "fixtures/corpus/verl-rl/004_verl-megatron-32b-optimizer-step-oom.log"
    text = real.read_text()
    log = tmp_path / "cut.log"
    log.write_text(text)
    rc = diagnose_paths([str(log)], jobs=1).root_cause
    assert rc is not None and rc.finding.signature.id == "MB-GEN-025" and rc.confidence == "suspected"
    # the line the paste lost, put back: an exception the layers read by its type and message
    whole = text.rsplit("\n", 2)[0] + "\n(TaskRunner pid=4022070)     exp_avg.lerp_(grad, 1 - beta1)\n" \
        "(TaskRunner pid=4022070) RuntimeError: The size of tensor a (4096) must match the size of tensor b (2048) at non-singleton dimension 0\n"
    log.write_text(whole)
    rc = diagnose_paths([str(log)], jobs=1).root_cause
    assert rc is not None and rc.finding.signature.id != "MB-GEN-025"


@pytest.mark.parametrize("bad", [
    "by_exception: [{id: x, signature: MB-GEN-011, types: [OutOfMemoryError], cut: true}]",
    "by_traceback: [{id: x, signature: MB-GEN-011, frames: forward, cut: 1}]",
])
def test_a_cut_flag_outside_a_traceback_row_is_refused(tmp_path, bad):
    from diagnose.analyze import layers

    (tmp_path / "layers").mkdir()
    (tmp_path / "layers" / "x.yaml").write_text("schema_version: 1\n" + bad + "\n")
    with pytest.raises(layers.LayerError, match="cut"):
        layers.load_tables(str(tmp_path))
