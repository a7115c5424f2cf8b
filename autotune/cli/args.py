"""The ``autotune`` command line: every verb and its flags (argparse), nothing it does.

Contract: :func:`build_parser` returns the parser; a verb's parsed arguments carry ``run``, the
name of its function in `autotune.cli.commands` (``init`` → ``cmd_init``).
"""

from __future__ import annotations

import argparse

from autotune.spec.backends import BACKENDS
from autotune.spec.model_yaml import SAMPLERS

DESCRIPTION = "The autotune command: init, search, estimate, export, compare, report, show, validate, studies."


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be ≥ 1, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="autotune", description=DESCRIPTION)
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
        help="length of the real run (default: the config's lr_schedule.total_steps; for -1, "
        "the dataset's length where init can count it, else 10000: one line says which)",
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
    init.set_defaults(run="init")

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
    search.set_defaults(run="search")

    estimate = verbs.add_parser("estimate", help="the cost model's verdict for one candidate")
    estimate.add_argument("model_yaml")
    estimate.add_argument(
        "--set",
        action="append",
        metavar="KNOB=VALUE",
        help="fix a knob (repeatable); the others take the study's baseline",
    )
    estimate.add_argument("--json", action="store_true")
    estimate.set_defaults(run="estimate")

    validate = verbs.add_parser("validate", help="check model.yaml and its space; run nothing")
    validate.add_argument("model_yaml")
    validate.add_argument("--set", action="append", metavar="KNOB=VALUE")
    validate.set_defaults(run="validate")

    studies = verbs.add_parser("studies", help="list the studies in the storage")
    studies.add_argument("--storage")
    studies.set_defaults(run="studies")

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
    export.set_defaults(run="export")

    comp = verbs.add_parser("compare", help="compare studies side by side (pandas)")
    comp.add_argument("studies", nargs="+")
    comp.add_argument("--storage")
    written = comp.add_mutually_exclusive_group()
    written.add_argument("--csv", help="also write every trial of the studies to this CSV file")
    written.add_argument("--parquet", help="… or to this Parquet file (needs pyarrow)")
    comp.set_defaults(run="compare")

    show = verbs.add_parser("show", help="a study at a glance, or one trial's diagnosis")
    show.add_argument("study")
    show.add_argument("--trial", type=int, help="one trial: its step split into parts, verdict")
    show.add_argument("--storage")
    show.set_defaults(run="show")

    report = verbs.add_parser("report", help="index.html with plots of one or more studies")
    report.add_argument("studies", nargs="+")
    report.add_argument("--out", required=True, help="folder to write (must be new or empty)")
    report.add_argument("--force", action="store_true", help="replace a non-empty --out")
    report.add_argument("--storage")
    report.set_defaults(run="report")
    return parser
