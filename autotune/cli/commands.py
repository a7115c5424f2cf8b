"""What each verb of the ``autotune`` command does (its flags: `autotune.cli.args`).

Contract: ``cmd_<verb>(args)`` validates what it is given before it writes or runs anything and
returns the exit code; bad input raises `autotune.spec.errors.SpecError` (`autotune.cli.main`
prints it and exits 2).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

from autotune.spec.backends import backend_of
from autotune.spec.errors import SpecError


def _knob_settings(pairs: list[str], flag: str = "--set") -> dict:
    """``["tp=8", "jit_level=O1"]`` → ``{"tp": 8, "jit_level": "O1"}`` (values parsed as YAML)."""
    settings = {}
    for pair in pairs or []:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise SpecError(f"{flag} {pair!r}: expected KNOB=VALUE")
        try:
            settings[name.strip()] = yaml.safe_load(value)
        except (yaml.YAMLError, ValueError) as exc:
            problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            raise SpecError(f"{flag} {pair!r}: not a YAML value: {problem}") from None
    return settings


def _load(args, extra_overrides: dict | None = None):
    """Validate model.yaml (with CLI overrides) and its search space, writing nothing."""
    from autotune.spec.model_yaml import load_spec
    from autotune.spec.space import build_space

    overrides = dict(extra_overrides or {})
    for flag, field in (
        ("study", "study"),
        ("trials", "search.n_trials"),
        ("sampler", "search.sampler"),
        ("seed", "search.seed"),
        ("steps", "trial.steps"),
    ):
        if getattr(args, flag, None) is not None:
            overrides[field] = getattr(args, flag)
    spec = load_spec(args.model_yaml, overrides)
    space = build_space(spec, _knob_settings(getattr(args, "set", None)))
    return spec, space


def cmd_init(args) -> int:
    from autotune.families.summary import model_line
    from autotune.spec.mindformers_init import how_to_run, init_text

    out = Path(args.out)
    if out.exists() and not args.force:
        raise SpecError(f"--out {out}: exists (pass --force to replace it)")
    if not out.parent.is_dir():
        raise SpecError(f"--out {out}: no folder {out.parent}")
    text, warnings = init_text(
        args.mindformers,
        out,
        args.devices,
        args.devices_per_node,
        args.backend,
        args.total_steps,
        args.run_mindformer,
        args.mindformers_python,
        args.synthetic_data,
    )
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    out.write_text(text, encoding="utf-8")
    print(f"wrote {out} from {args.mindformers} ({len(warnings)} warnings, listed at its top)")
    print(model_line(yaml.safe_load(text)["model"]))
    if args.run_mindformer is None:
        print(f"note: {how_to_run(yaml.safe_load(text)['cluster']['backend'])}")
    return 0


def cmd_search(args) -> int:
    if args.confirm < 0 or args.confirm_runs < 1:
        raise SpecError("--confirm K needs K ≥ 0 and --confirm-runs R needs R ≥ 1")
    from autotune.stopping.budget import parse_budget

    budget = parse_budget(args.budget) if args.budget is not None else None
    spec, space = _load(args)
    from autotune.execution.ray_cluster import ClusterLost
    from autotune.storage.connection import resolve_storage
    from autotune.study.progress import Progress
    from autotune.study.run import run_study

    progress = Progress()
    for note in space.notes:
        progress.note(note)
    try:
        run_study(
            spec,
            space,
            storage=resolve_storage(args.storage),
            study_name=spec.study,
            n_trials=spec.search.n_trials,
            resume=args.resume,
            artifacts=Path(args.artifacts).resolve(),
            ray_address=args.ray_address,
            progress=progress,
            confirm_top=args.confirm,
            confirm_runs=args.confirm_runs,
            budget=budget,
            stop_when_flat=args.stop_when_flat,
            warm=tuple(args.warm_start or ()),
        )
    except KeyboardInterrupt:
        print(
            f"\ninterrupted: running trials recorded as interrupted; continue with "
            f"autotune search {args.model_yaml} --study {spec.study} --resume",
            file=sys.stderr,
        )
        return 130
    except ClusterLost as exc:
        print(
            f"error: {exc}: running trials recorded as interrupted; continue with "
            f"autotune search {args.model_yaml} --study {spec.study} --resume",
            file=sys.stderr,
        )
        return 1
    return 0


def cmd_estimate(args) -> int:
    from autotune import costmodel
    from autotune.families.summary import model_line, parameter_count
    from autotune.spec.constraints import violations

    spec, space = _load(args)
    # Knobs not --set take the baseline: the candidate a study on this file runs first.
    candidate = space.baseline()
    est = costmodel.estimate(spec, candidate)
    reasons = violations(spec, candidate)
    caveat = costmodel.resolve_profile(spec.cluster).caveat  # e.g. H100/H200: calibrate first
    if args.json:
        out = est.as_dict()
        if reasons:
            out.update(feasible=False, reason="; ".join(reasons))
        out["candidate"] = candidate.as_dict()
        out["parameters"] = parameter_count(spec.model.as_config())
        if caveat:
            out["caveat"] = caveat
        print(json.dumps(out, indent=2))
    else:
        print(model_line(spec.model.as_config()))
        print("candidate: " + " ".join(f"{k}={v}" for k, v in candidate.as_dict().items()))
        for reason in reasons:
            print(f"violates: {reason}")
        print(costmodel.format_estimate(est))
        if caveat:
            print(f"note: {caveat}")
    return 0


def cmd_validate(args) -> int:
    spec, space = _load(args)
    notes = list(space.notes)
    if backend_of(spec.cluster.backend).kind == "table":  # the table is input too
        from autotune.execution.replay import load_table

        notes += load_table(spec, space).notes
    for note in notes:
        print(f"· {note}")
    searched = space.searched()
    print(
        f"{args.model_yaml}: ok — study {spec.study!r}, backend {spec.cluster.backend}, "
        f"{spec.cluster.devices} devices, searching {', '.join(searched) or 'nothing'}"
    )
    return 0


def cmd_studies(args) -> int:
    import optuna

    from autotune.storage.connection import open_storage, resolve_storage

    for summary in optuna.get_all_study_summaries(open_storage(resolve_storage(args.storage))):
        print(f"{summary.study_name}\t{summary.n_trials} trials")
    return 0


def cmd_compare(args) -> int:
    import pandas as pd

    from autotune.analysis.frames import compare, summary

    table = summary(args.studies, args.storage)  # first: an unknown study writes no file
    if args.csv or args.parquet:
        frame = compare(args.studies, args.storage)
        if args.parquet:
            try:
                frame.to_parquet(args.parquet, index=False)
            except ImportError:
                raise SpecError("--parquet needs a Parquet engine: pip install pyarrow") from None
        else:
            frame.to_csv(args.csv, index=False)
        print(f"wrote {len(frame)} trials to {args.parquet or args.csv}")
    with pd.option_context("display.max_rows", None, "display.width", 200):
        print(table.to_string())
    return 0


def cmd_show(args) -> int:
    from rich.console import Console

    from autotune.analysis.show import show_study, show_trial
    from autotune.analysis.view import view

    v = view(args.study, args.storage)
    terminal = Console()
    # a terminal wraps at its width; a pipe or a log gets whole rows
    console = Console(highlight=False, width=None if terminal.is_terminal else 200)
    if args.trial is None:
        show_study(v, console)
        return 0
    trial = next((t for t in v.trials if t.number == args.trial), None)
    if trial is None:
        raise SpecError(f"--trial {args.trial}: study {args.study!r} has no such trial")
    show_trial(v, trial, console)
    return 0


def cmd_report(args) -> int:
    from autotune.analysis.report import write_report

    index = write_report(args.studies, Path(args.out), args.storage, overwrite=args.force)
    print(f"wrote {index}")
    return 0


def cmd_export(args) -> int:
    from autotune.export.from_study import export_study

    trial, files = export_study(
        args.study,
        args.storage,
        Path(args.out),
        args.trial,
        reshard_from=args.reshard,
        overwrite=args.force,
        mindformers_base=args.mindformers_base,
    )
    print(f"exported trial #{trial.number} of {args.study} to {args.out}:")
    for file in files:
        print(f"  {file}")
    summary = json.loads((Path(args.out) / "summary.json").read_text())
    merged, trials = summary.get("mindformers"), summary["trials"]
    if merged:
        print(
            f"mindformers.yaml: {merged['base']} with {len(merged['changes'])} keys changed "
            "(listed at its top)"
        )
    if trials.get("launch"):
        print(f"run it as the study's trials ran: {trials['launch']}")
    if trials.get("note"):
        print(f"  ({trials['note']})")
    return 0
