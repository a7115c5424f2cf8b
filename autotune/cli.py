"""The ``autotune`` command: init, search, estimate, export, compare, report, show, validate, studies.

Contract: bad input (a model.yaml field, a flag, a study name) prints ``error: …`` naming the
field or file and exits 2 with nothing written; Ctrl-C during a search exits 130 after the
running trials were recorded as interrupted (``--resume`` reruns them).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

from autotune.spec.backends import BACKENDS, backend_of
from autotune.spec.errors import SpecError
from autotune.spec.model_yaml import SAMPLERS


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
    from autotune.spec.mindformers_init import HOW_TO_RUN_MINDFORMERS, init_text

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
        print(f"note: {HOW_TO_RUN_MINDFORMERS}")
    return 0


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be ≥ 1, got {value}")
    return value


def cmd_search(args) -> int:
    if args.confirm < 0 or args.confirm_runs < 1:
        raise SpecError("--confirm K needs K ≥ 0 and --confirm-runs R needs R ≥ 1")
    from autotune.stopping.budget import parse_budget

    budget = parse_budget(args.budget) if args.budget is not None else None
    spec, space = _load(args)
    from autotune.execution.dispatch import ClusterLost
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
    merged = json.loads((Path(args.out) / "summary.json").read_text()).get("mindformers")
    if merged:
        print(
            f"mindformers.yaml: {merged['base']} with {len(merged['changes'])} keys changed "
            "(listed at its top)"
        )
    if merged and merged.get("launch"):
        print(f"run it as the study's MindFormers trials ran: {merged['launch']}")
        if merged.get("data") == "synthetic":
            print(
                "  (they read a synthetic MindRecord: add -- --train_dataset_dir PATH, or train "
                "on the config's own dataset)"
            )
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="autotune", description=__doc__.splitlines()[0])
    verbs = parser.add_subparsers(dest="verb", required=True)

    init = verbs.add_parser("init", help="write a model.yaml from a MindFormers config")
    init.add_argument(
        "--mindformers",
        required=True,
        metavar="CONFIG.yaml",
        help="a MindFormers training config (its base_config chain is followed)",
    )
    init.add_argument(
        "--devices",
        type=_positive,
        help="devices to tune for (default: the "
        "config's dp × mp × pp; another count keeps the global batch, scales dp)",
    )
    init.add_argument("--devices-per-node", type=_positive)
    # every backend but a replay's, whose table of measured candidates init cannot write
    init.add_argument(
        "--backend",
        choices=[name for name, backend in BACKENDS.items() if backend.kind != "table"],
        help="default: the config's context.device_target",
    )
    init.add_argument(
        "--total-steps",
        type=_positive,
        help="length of the real run (required when the config says -1)",
    )
    init.add_argument(
        "--run-mindformer",
        metavar="PATH",
        help="MindFormers' run_mindformer.py: every trial runs it on the config (trial.program "
        "mindformers; default: autotune's own trainer)",
    )
    init.add_argument(
        "--mindformers-python",
        metavar="PATH",
        help="the interpreter of MindFormers' venv (default: found beside run_mindformer.py)",
    )
    init.add_argument(
        "--synthetic-data",
        action="store_true",
        help="MindFormers trials read a generated MindRecord (trial.data synthetic), not the "
        "config's dataset",
    )
    init.add_argument("--out", default="model.yaml", help="the file to write (default model.yaml)")
    init.add_argument("--force", action="store_true", help="replace an existing --out")
    init.set_defaults(run=cmd_init)

    search = verbs.add_parser("search", help="tune the knobs of MODEL_YAML with real trials")
    search.add_argument("model_yaml")
    search.add_argument("--trials", type=int, help="finished trials to reach (search.n_trials)")
    search.add_argument("--study", help="study name (default: model.yaml's study)")
    search.add_argument(
        "--storage",
        help="Optuna storage URL (default: $AUTOTUNE_STORAGE or sqlite:///trials/autotune.db)",
    )
    search.add_argument("--sampler", choices=SAMPLERS)
    search.add_argument("--seed", type=int)
    search.add_argument("--steps", type=int, help="training steps per trial (trial.steps)")
    search.add_argument(
        "--set", action="append", metavar="KNOB=VALUE", help="fix a knob (repeatable)"
    )
    search.add_argument(
        "--resume",
        action="store_true",
        help="continue the named study until it has N finished trials",
    )
    search.add_argument("--ray-address", help="join an existing Ray cluster")
    search.add_argument("--artifacts", default="trials", help="folder of per-trial artefacts")
    search.add_argument(
        "--confirm",
        type=int,
        default=2,
        metavar="K",
        help="after the search, run the top K trials and the baseline again "
        "(real backends; default 2)",
    )
    search.add_argument(
        "--no-confirm", dest="confirm", action="store_const", const=0, help="no confirm phase"
    )
    search.add_argument(
        "--confirm-runs",
        type=int,
        default=2,
        metavar="R",
        help="re-runs of each confirmed trial (default 2)",
    )
    search.add_argument(
        "--budget",
        metavar="TIME|DH",
        help="stop dispatching before the study's wall time (90m, 2h) or "
        "device-hours (40dh) would be exceeded; spans resumes",
    )
    search.add_argument(
        "--warm-start",
        action="append",
        metavar="STUDY",
        help="start from the measured trials of an earlier study of the same "
        "model and cluster (repeatable; another model is refused)",
    )
    search.add_argument(
        "--stop-when-flat",
        action="store_true",
        help="also stop when the last runs stopped improving the best "
        "(autotune/stopping/budget.py states the rule)",
    )
    search.set_defaults(run=cmd_search)

    estimate = verbs.add_parser("estimate", help="the cost model's verdict for one candidate")
    estimate.add_argument("model_yaml")
    estimate.add_argument(
        "--set",
        action="append",
        metavar="KNOB=VALUE",
        help="fix a knob (repeatable); the others take the study's baseline",
    )
    estimate.add_argument("--json", action="store_true")
    estimate.set_defaults(run=cmd_estimate)

    validate = verbs.add_parser("validate", help="check model.yaml and its space; run nothing")
    validate.add_argument("model_yaml")
    validate.add_argument("--set", action="append", metavar="KNOB=VALUE")
    validate.set_defaults(run=cmd_validate)

    studies = verbs.add_parser("studies", help="list the studies in the storage")
    studies.add_argument("--storage")
    studies.set_defaults(run=cmd_studies)

    export = verbs.add_parser("export", help="strategy.ckpt + launch config of a trial")
    export.add_argument("study")
    export.add_argument("--out", required=True, help="folder to write (must be new or empty)")
    export.add_argument("--trial", type=int, help="trial number (default: the best)")
    export.add_argument(
        "--reshard",
        metavar="FULL_CKPT",
        help="also reshard this full checkpoint into checkpoint/rank_*/",
    )
    export.add_argument("--force", action="store_true", help="overwrite a non-empty --out")
    export.add_argument(
        "--mindformers-base",
        metavar="PATH.yaml",
        help="your model's MindFormers config: mindformers.yaml becomes it with the "
        "tuned settings merged in (default: model.yaml's "
        "export.mindformers_base, else an overlay naming base_config)",
    )
    export.add_argument("--storage")
    export.set_defaults(run=cmd_export)

    comp = verbs.add_parser("compare", help="compare studies side by side (pandas)")
    comp.add_argument("studies", nargs="+")
    comp.add_argument("--storage")
    written = comp.add_mutually_exclusive_group()
    written.add_argument("--csv", help="also write every trial of the studies to this CSV file")
    written.add_argument("--parquet", help="… or to this Parquet file (needs pyarrow)")
    comp.set_defaults(run=cmd_compare)

    show = verbs.add_parser("show", help="a study at a glance, or one trial's diagnosis")
    show.add_argument("study")
    show.add_argument("--trial", type=int, help="one trial: its step split into parts, verdict")
    show.add_argument("--storage")
    show.set_defaults(run=cmd_show)

    report = verbs.add_parser("report", help="index.html with plots of one or more studies")
    report.add_argument("studies", nargs="+")
    report.add_argument("--out", required=True, help="folder to write (must be new or empty)")
    report.add_argument("--force", action="store_true", help="replace a non-empty --out")
    report.add_argument("--storage")
    report.set_defaults(run=cmd_report)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except SpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
