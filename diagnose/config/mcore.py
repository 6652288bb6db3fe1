"""``diagnose check --mcore``: let megatron-core itself validate the config.

Builds MCore's own ``TransformerConfig`` (from ``model.*``) and ``OptimizerConfig`` (from
``optimizer.*``) exactly as Bridge does before training (Bridge's ``finalize()`` runs MCore's
``__post_init__``), catches the real exception, and names it through the signature database: the
exception's ``Type: message`` line, and the source line that raised it (for MCore's bare
``assert``s with an empty message), are matched against every line signature with
``match.verify.line_matches``; of those that match, the ones that apply to the installed MCore
version win.

What is converted: dtype names (``torch.bfloat16``) to torch dtypes, dotted function names under
``torch.`` (``torch.nn.functional.silu``) to the function; keys the dataclass does not have
(Bridge's provider fields such as ``seq_length``) are left out, as Bridge passes them elsewhere.

On a machine without Transformer Engine, a few MCore checks refuse TE-only features
(``moe_permute_fusion`` ...) whatever the config says. The job runs with TE, so those checks are
answered as if TE were present: ``megatron.core.utils.is_te_min_version`` returns True while the
config is built (and nothing else is patched).
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib
import re
import traceback
import warnings
from dataclasses import dataclass

from ..db import Database, applies_to
from ..match.verify import line_matches
from ..model import Role, Scope, Signature
from .runconfig import RunConfig


class MCoreUnavailable(RuntimeError):
    """megatron-core (or torch) cannot be imported here."""


@dataclass
class MCoreResult:
    stage: str  # "TransformerConfig" | "OptimizerConfig"
    exc_type: str
    message: str
    source_line: str  # the source line that raised (MCore's file), for bare asserts
    signature: Signature | None  # the database's name for it, or None
    environment: bool = False  # MCore could not check on this machine (ImportError ...): not a finding

    @property
    def line(self) -> str:
        return f"{self.exc_type}: {self.message}" if self.message else self.exc_type


def version() -> str | None:
    """The installed megatron-core version, without importing it (importing takes seconds)."""
    try:
        from importlib.metadata import PackageNotFoundError
        from importlib.metadata import version as _v

        return _v("megatron-core")
    except PackageNotFoundError:
        return None


@contextlib.contextmanager
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _classes():
    try:
        with _quiet():
            import torch  # noqa: F401
            from megatron.core.optimizer.optimizer_config import OptimizerConfig
            from megatron.core.transformer.transformer_config import TransformerConfig
    except Exception as exc:  # noqa: BLE001 - any import failure means: not available here
        raise MCoreUnavailable(f"megatron-core cannot be imported ({type(exc).__name__}: {exc})") from None
    return TransformerConfig, OptimizerConfig


def _convert(value):
    import torch

    if isinstance(value, str) and value.startswith("torch."):
        attr = value[len("torch."):]
        if hasattr(torch, attr) and isinstance(getattr(torch, attr), torch.dtype):
            return getattr(torch, attr)
        mod, _, name = value.rpartition(".")
        try:
            obj = getattr(importlib.import_module(mod), name)
            if callable(obj):
                return obj
        except (ImportError, AttributeError):
            pass
    return value


def _kwargs(klass, section: dict | None) -> dict:
    names = {f.name for f in dataclasses.fields(klass) if f.init}
    out = {}
    for k, v in (section or {}).items():
        if k not in names:
            continue
        if isinstance(v, dict):
            # Bridge dumps a torch attribute as {_target_: torch.bfloat16, _call_: false}: the
            # attribute itself; any other serialized object (enum, partial): leave the default
            target = v.get("_target_")
            if v.get("_call_") is False and isinstance(target, str) and target.startswith("torch."):
                conv = _convert(target)
                if conv is not target:
                    out[k] = conv
            continue
        out[k] = _convert(v)
    return out


# Names MCore imports from its Transformer Engine wrappers only when TE imports (moe_utils'
# ``try: import transformer_engine``); config checks import them to see whether TE provides them.
_TE_NAMES = {
    "megatron.core.transformer.moe.moe_utils": (
        "fused_compute_score_for_moe_aux_loss", "fused_moe_aux_loss", "fused_permute", "fused_permute_with_probs",
        "fused_sort_chunks_by_index", "fused_sort_chunks_by_index_with_probs", "fused_topk_with_score_function",
        "fused_unpermute", "te_general_gemm",
    ),
}


# an error MCore raises in place of an ImportError it caught ("--use-precision-aware-optimizer
# requires FusedAdam from TransformerEngine, but not found."): the host lacks a package
_MISSING_PACKAGE = re.compile(
    r"(?:TransformerEngine|Transformer Engine|transformer_engine|\bTE\b|\bapex\b|flash[-_ ]?attn)"
    r"[^.]{0,40}\bbut not (?:found|installed|available)\b")


def _te_stand_in(*_a, **_k):  # pragma: no cover - never called: config checks only test presence
    raise RuntimeError("Transformer Engine stand-in (diagnose check --mcore) must not be called")


@contextlib.contextmanager
def _te_present():
    import megatron.core.utils as U

    added = []
    for modname, names in _TE_NAMES.items():
        try:
            mod = importlib.import_module(modname)
        except ImportError:
            continue
        for name in names:
            if not hasattr(mod, name):
                setattr(mod, name, _te_stand_in)
                added.append((mod, name))
    patched = []
    mods = [U]
    for name in ("megatron.core.transformer.transformer_config", "megatron.core.optimizer.optimizer_config",
                 "megatron.core.model_parallel_config"):
        try:
            mods.append(importlib.import_module(name))
        except ImportError:
            pass
    for m in mods:
        if hasattr(m, "is_te_min_version"):
            patched.append((m, m.is_te_min_version))
            m.is_te_min_version = lambda *a, **k: True
    try:
        yield
    finally:
        for m, fn in patched:
            m.is_te_min_version = fn
        for mod, name in added:
            delattr(mod, name)


def _raising_line(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    for fr in reversed(frames):
        if "megatron" in fr.filename.replace("\\", "/"):
            return (fr.line or "").strip()
    return (frames[-1].line or "").strip() if frames else ""


def name_exception(db: Database, exc_type: str, message: str, source_line: str,
                   versions: dict) -> Signature | None:
    """The line signature that names this exception (version-applicable ones first)."""
    lines = [f"{exc_type}: {message}" if message else exc_type]
    if source_line:
        lines.append(source_line)
    cands = [s for s in db.signatures if s.scope == Scope.LINE and s.anchors and s.role != Role.ADVICE
             and any(line_matches(s, ln) for ln in lines)]
    if not cands:
        return None
    applicable = [s for s in cands if applies_to(s, versions)] or cands
    return max(applicable, key=lambda s: (s.priority, -cands.index(s)))


def validate(cfg: RunConfig, db: Database, versions: dict | None = None) -> list[MCoreResult]:
    """Build MCore's configs from ``cfg``; one result per config object that MCore refused."""
    TransformerConfig, OptimizerConfig = _classes()
    versions = dict(versions or {})
    versions.setdefault("megatron-core", version())
    out = []
    model = dict(cfg.get("model") or {})
    if isinstance(model.get("transformer"), dict):
        model = {**model, **model["transformer"]}
    for stage, klass, section in (("TransformerConfig", TransformerConfig, model),
                                  ("OptimizerConfig", OptimizerConfig, cfg.get("optimizer"))):
        if not section:  # nothing to validate (a config with no model / optimizer section)
            continue
        kwargs = _kwargs(klass, section)
        if stage == "TransformerConfig" and cfg.get("mlm") and "pipeline_dtype" not in kwargs:
            # Megatron-LM derives it from the parameters' dtype (core_transformer_config_from_args):
            # its arguments dump has no such argument
            import torch

            kwargs["pipeline_dtype"] = (torch.bfloat16 if kwargs.get("bf16") else torch.float16 if kwargs.get("fp16")
                                        else torch.float32)
        try:
            with _quiet(), _te_present():
                klass(**kwargs)
        except (ImportError, NotImplementedError) as exc:
            # the machine, not the config: MCore needed something this host lacks (TE, CUDA)
            out.append(MCoreResult(stage, type(exc).__name__, str(exc).strip(), _raising_line(exc), None,
                                   environment=True))
        except Exception as exc:  # noqa: BLE001 - MCore's own refusal is what we report
            msg = str(exc).strip()
            src = _raising_line(exc)
            if _MISSING_PACKAGE.search(msg):
                # MCore caught the ImportError itself and raised its own error: still the host
                out.append(MCoreResult(stage, type(exc).__name__, msg, src, None, environment=True))
                continue
            sig = name_exception(db, type(exc).__name__, msg, src, versions)
            out.append(MCoreResult(stage, type(exc).__name__, msg, src, sig))
    return out
