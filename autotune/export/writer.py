"""write_export: one trial → an export folder (the files docs/export.md, "The files", lists).

Contract: :func:`write_export` validates everything first — the trial record, the candidate's
hard constraints, that every split dimension divides by tp and every stage gets layers, that
MindSpore and MindFormers can run the exported configs (``configs.export_reasons``), the output
folder, the MindFormers base config and the checkpoint to reshard — and raises
:class:`SpecError` listing the problems before anything is written. It then writes into a
temporary sibling folder, checks the strategy file covers every parameter, and renames the
folder into place, so a failure at any point leaves no half-written export. Returns the files of
the finished folder, sorted. A run backend MindFormers cannot run (``Backend.no_mindformers``:
gpu) gets no mindformers.yaml, and a ``mindformers_base`` for it is refused with that reason; a
CPU export MindFormers runs gets its CPU training step beside it
(`autotune.mindformers.cpu_form.CPU_WRAPPER_FILE`). A built-in llama model whose MindFormers
base is an mcore config gets its strategy under MindFormers' mcore names and shapes
(`autotune.families.mcore`; `autotune.export.params.mcore_base`), or the reasons it cannot.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import yaml

from autotune import mindformers as mf
from autotune.export import configs
from autotune.export.launch_sh import launch_script
from autotune.export.params import mcore_base, model_parameters, tp_rules
from autotune.export.reshard import plan_reshard, reshard
from autotune.export.strategy import STRATEGY_FILE, check_coverage, write_strategies
from autotune.families.mcore import (
    MCORE_FROZEN,
    MCORE_WHOLE,
    mcore_reasons,
    mcore_rules,
    mcore_shapes,
)
from autotune.files import staged_folder
from autotune.layout import (
    DTYPE_BYTES,
    optimizer_whole,
    plan_layout,
    with_optimizer_shards,
    with_optimizer_states,
)
from autotune.mindformers import config as mf_config
from autotune.mindformers import cpu_form
from autotune.spec.candidate import Candidate
from autotune.spec.constraints import violations
from autotune.spec.errors import SpecError
from autotune.spec.mindformers_layers import pipeline_interleave
from autotune.spec.programs import program_of
from autotune.spec.specs import Spec

CHECKPOINT_DIR = "checkpoint"
_SHOWN_REASONS = 6


def _check_trial(trial: dict) -> None:
    if not (
        isinstance(trial, dict)
        and isinstance(trial.get("number"), int)
        and isinstance(trial.get("study"), str)
        and isinstance(trial.get("metrics"), dict)
        and isinstance(trial.get("estimate"), (dict, type(None)))
    ):
        raise ValueError(
            "trial must be {'number': int, 'study': str, 'metrics': dict, "
            f"'estimate': dict | None}}, got {trial!r}"
        )


def _check_out_dir(out_dir: Path, overwrite: bool) -> None:
    if out_dir.exists() and not out_dir.is_dir():
        raise SpecError(f"--out {out_dir}: exists and is not a folder")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not overwrite:
        raise SpecError(f"--out {out_dir}: folder exists and is not empty")


def _launch_header(study: str, number: int) -> str:
    return (
        f"# autotune export of study {json.dumps(study)}, trial {number}: every setting as the\n"
        "# MindSpore 2.10 call it becomes, each section that call's keyword arguments:\n"
        "#   device                -> mindspore.set_device(**device)\n"
        "#   context               -> mindspore.set_context(**context)  (mode 0 = GRAPH_MODE,\n"
        "#                            1 = PYNATIVE_MODE)\n"
        "#   jit_config            -> cell.set_jit_config(mindspore.JitConfig(**jit_config)) on the\n"
        "#                            training cell (graph mode only)\n"
        "#   auto_parallel_context -> mindspore.set_auto_parallel_context(**auto_parallel_context)\n"
        "# loss_scale null: the dtype is not loss-scaled. strategy.ckpt is not a strategy to\n"
        "# load: it describes the run's checkpoints for mindspore.parallel.transform_checkpoints.\n"
    )


def _yaml(document: dict) -> str:
    return yaml.safe_dump(document, sort_keys=False, width=100, allow_unicode=True)


def _write_documents(
    folder: Path,
    spec: Spec,
    c: Candidate,
    trial: dict,
    run_config: dict,
    layouts: dict,
    extra: dict,
    mindformers_yaml: str | None,
) -> None:
    summary = configs.summary(spec, c, trial, layouts, extra)
    documents = {
        "train_config.json": json.dumps(run_config, indent=2),
        "launch.yaml": _launch_header(trial["study"], trial["number"])
        + _yaml(configs.launch_yaml(spec, c, trial)),
        **({"mindformers.yaml": mindformers_yaml} if mindformers_yaml is not None else {}),
        "summary.json": json.dumps(summary, indent=2, allow_nan=False, ensure_ascii=False),
    }
    if mindformers_yaml is not None and cpu_form.on_cpu(spec, c):
        documents[cpu_form.CPU_WRAPPER_FILE] = (
            mf.CLUSTER_DIR / cpu_form.CPU_WRAPPER_FILE
        ).read_text()
    for name, text in documents.items():
        (folder / name).write_text(text.rstrip("\n") + "\n", encoding="utf-8")
    script = folder / "launch.sh"
    script.write_text(launch_script(spec, c, trial), encoding="utf-8")
    script.chmod(0o755)


def saved_layouts(
    spec: Spec, c: Candidate, layouts: dict, whole: tuple[str, ...] | None = None
) -> dict:
    """``layouts`` as the run saves them: with the parallel optimizer's shards when it is on
    (``whole``: the globs it leaves whole; None: the model family's)."""
    if not c.parallel_optimizer:
        return layouts
    return with_optimizer_shards(
        layouts,
        c.dp,
        c.tp,
        DTYPE_BYTES[spec.model.param_dtype],
        whole=optimizer_whole(spec.model.as_config()) if whole is None else whole,
        ep=c.ep,
    )


def _planned(spec: Spec, c: Candidate, run_config: dict, mcore: dict | None, interleave: int):
    """``(layouts, reasons)``: under MindFormers' mcore names when ``mcore`` (the base's
    model_config, `autotune.export.params.mcore_base`), else the model's own; the layers dealt
    to the stages in ``interleave`` chunks each, as the base's interleaved pipeline runs them."""
    if mcore is None:
        shapes, rules, reasons = model_parameters(spec, run_config), tp_rules(spec), []
    else:
        model = spec.model.as_config()
        shapes, rules = mcore_shapes(model, mcore), mcore_rules(model)
        reasons = [f"mcore base: {r}" for r in mcore_reasons(model, mcore, c.tp, c.pp)]
    layouts, layout_reasons = plan_layout(shapes, c.tp, c.pp, rules, c.ep, interleave)
    return layouts, reasons + layout_reasons


def write_export(
    spec: Spec,
    candidate: Candidate,
    trial: dict,
    out_dir: str | os.PathLike,
    reshard_from: str | None = None,
    overwrite: bool = False,
    mindformers_base: str | None = None,
) -> list[Path]:
    """Write the export folder for ``candidate`` (the knobs of ``trial``) to ``out_dir``.

    ``trial`` is ``{"number": int, "study": str, "metrics": dict, "estimate": dict | None}``.
    ``reshard_from``: a full checkpoint to split into ``out_dir/checkpoint/rank_<r>/``.
    ``overwrite``: replace a non-empty ``out_dir`` (otherwise that is an error).
    ``mindformers_base``: the model's MindFormers config; mindformers.yaml is then that config
    with the tuned settings merged in (else an overlay to merge over it).
    """
    _check_trial(trial)
    out_dir = Path(out_dir).resolve()
    _check_out_dir(out_dir, overwrite)
    c = candidate
    run_config = configs.train_config(spec, c, trial)
    mcore = mcore_base(spec, mindformers_base)
    # the stages MindFormers runs each layer on under the base's interleaved pipeline
    interleave = pipeline_interleave(mindformers_base) if mindformers_base and c.pp > 1 else 1
    layouts, reasons = _planned(spec, c, run_config, mcore, interleave)
    reasons += violations(spec, c) + configs.export_reasons(spec, c)
    if interleave > 1 and reshard_from:
        # the rank folders --reshard writes are for launch.sh's trainer, which runs each
        # stage's layers as one block; the strategy here deals them as the base interleaves
        reasons.append(
            f"--reshard: the base interleaves its pipeline (pp_interleave_num {interleave}), "
            "so its stages hold other layers than autotune's trainer's; reshard with "
            "launch.sh --mindformers --load-checkpoint"
        )
    if mcore is not None and reshard_from:
        # the rank folders --reshard writes are for launch.sh's trainer, whose network has the
        # legacy llama's names; the strategy here holds MindFormers' mcore names
        reasons.append(
            "--reshard: the strategy holds MindFormers' mcore names (the base is an mcore "
            "config), which autotune's trainer does not have; reshard with launch.sh "
            "--mindformers --load-checkpoint"
        )
    if reasons:
        shown = "; ".join(reasons[:_SHOWN_REASONS])
        more = (
            f" (and {len(reasons) - _SHOWN_REASONS} more)" if len(reasons) > _SHOWN_REASONS else ""
        )
        raise SpecError(f"cannot export trial {trial['number']} of {trial['study']}: {shown}{more}")
    refusal = configs.run_backend(spec).no_mindformers
    if mindformers_base and refusal:
        raise SpecError(f"--mindformers-base: {refusal}")
    plan = plan_reshard(reshard_from, layouts) if reshard_from else None
    mindformers_yaml, changes = (
        (None, []) if refusal else mf_config.document(spec, c, trial, mindformers_base)
    )

    with staged_folder(out_dir) as staged:
        # the strategy describes the trainer's per-rank checkpoints: parameters and Adam moments,
        # each a shard of its slice where the parallel optimizer splits it
        whole, frozen = (MCORE_WHOLE, MCORE_FROZEN) if mcore is not None else (None, ())
        saved = with_optimizer_states(saved_layouts(spec, c, layouts, whole), frozen)
        write_strategies(saved, c.dp, c.tp, c.pp, staged, c.ep)
        check_coverage(staged / STRATEGY_FILE, saved, c.pp)
        extra = {"reshard": plan.describe()} if plan else {}
        program = program_of(spec)  # the run its trials were
        notes = program.export_notes(spec, str(out_dir / "launch.sh"))
        extra["trials"] = {"program": program.name, **notes}
        if mindformers_base:
            extra["mindformers"] = {
                "base": str(Path(mindformers_base).resolve()),
                "changes": changes,
            }
        _write_documents(staged, spec, c, trial, run_config, layouts, extra, mindformers_yaml)
        if plan:
            reshard(plan, c.dp, c.tp, c.pp, staged / CHECKPOINT_DIR)
    return sorted(p for p in out_dir.rglob("*") if p.is_file())
