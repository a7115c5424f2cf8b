"""How many steps a MindFormers run takes (``train.total_steps`` of ``autotune init``).

Contract: :func:`total_steps` returns ``(steps, where, line)`` for a config (its typed view) and
the global batch MindFormers runs it with: ``lr_schedule.total_steps`` when the config gives
a positive one; else — ``-1``, "the dataset's length" — what MindFormers derives,
``runner_config.epochs`` (its default 1) × the dataset's batches per epoch
(``BaseTrainer.create_lr_scheduler``: ``epochs × train_data_size``; in sink mode MindFormers
rescales the epochs by ``data_size / sink_size`` first, ``trainer/utils.py``, so the product is
the same), where the config lets init count them:

- ``BlendedMegatronDatasetDataLoader``: ``sizes[0] // global batch``
  (``BaseTrainer._process_megatron_dataset``: ``dataset.take(sizes[0] // global_batch_size)``);
- ``MindDataset`` whose ``dataset_dir`` is here (a folder walked for ``*.mindrecord[N]`` files,
  or such a file, as MindFormers' ``CausalLanguageModelDataset`` finds them): the samples its
  MindRecord index files hold (each data file's ``<file>.db``, an SQLite table ``INDEXES`` of a
  row per sample) // global batch.

Otherwise None, unknown here: model.yaml's ``train.total_steps`` is then written null — a study
prices autotune's default (`autotune.spec.specs.DEFAULT_TOTAL_STEPS`) and the export writes no
``lr_schedule.total_steps``, so the config's -1 stands and MindFormers derives the run's length
as above (`autotune.mindformers.config`) rather than run the default as if it were the dataset's.
``line`` says in one line which it was (None when the config gave the number);
``--total-steps`` (``given``) wins over all of it.
"""

from __future__ import annotations

import os
import re
import sqlite3
from pathlib import Path

from autotune.spec.specs import DEFAULT_TOTAL_STEPS

KEY = "lr_schedule.total_steps"
_MINDRECORD = re.compile(r"mindrecord\d*$")  # MindFormers' pattern for MindRecord data files


def mindrecord_samples(dataset_dir: str) -> int | None:
    """Samples of the MindRecord files MindFormers reads for ``dataset_dir``, None when there
    are none or their index files cannot be read."""
    path = Path(os.path.abspath(os.path.expanduser(dataset_dir)))
    if path.is_dir():
        files = [p for p in sorted(path.rglob("*")) if _MINDRECORD.search(p.name)]
    else:
        files = [path] if _MINDRECORD.search(path.name) and path.is_file() else []
    total = 0
    for file in files:
        index = file.with_name(file.name + ".db")
        try:
            with sqlite3.connect(f"{index.as_uri()}?mode=ro", uri=True) as db:
                total += db.execute("SELECT COUNT(*) FROM INDEXES").fetchone()[0]
        except (sqlite3.Error, ValueError):
            return None
    return total or None


def _epoch_batches(cfg, batch: int) -> tuple[int, str] | None:
    """(batches per epoch, how they were counted), None where the config does not say."""
    loader = cfg.get("train_dataset.data_loader", {}) or {}
    kind = loader.get("type") if isinstance(loader, dict) else None
    if kind == "BlendedMegatronDatasetDataLoader":
        sizes = loader.get("sizes")
        if isinstance(sizes, list) and sizes and isinstance(sizes[0], int) and sizes[0] > 0:
            return (
                sizes[0] // batch,
                f"train_dataset.data_loader.sizes[0] {sizes[0]} // global batch {batch}",
            )
    if kind == "MindDataset" and isinstance(loader.get("dataset_dir"), str):
        samples = mindrecord_samples(loader["dataset_dir"]) if loader["dataset_dir"] else None
        if samples:
            return (
                samples // batch,
                f"the {samples} samples of train_dataset.data_loader.dataset_dir's MindRecord "
                f"// global batch {batch}",
            )
    return None


def total_steps(cfg, batch: int, given: int | None) -> tuple[int | None, str, str | None]:
    """``(steps, where, line)`` (see the module doc)."""
    if given is not None:
        return given, "--total-steps", None
    stated = cfg.get(KEY, -1)
    if isinstance(stated, bool) or not isinstance(stated, int) or stated == 0 or stated < -1:
        cfg.fail(KEY, f"must be a positive integer or -1 (the dataset's length), got {stated!r}")
    if stated > 0:
        return stated, KEY, None
    epochs = cfg.number("runner_config.epochs", default=1, minimum=1)
    counted = _epoch_batches(cfg, batch)
    if counted is not None and counted[0] * epochs > 0:
        steps = counted[0] * epochs
        how = f"runner_config.epochs {epochs} × ({counted[1]})"
        return steps, how, f"{KEY}: -1: {steps} steps, as MindFormers derives them: {how}"
    return (
        None,
        f"{KEY} -1, the dataset's length, unknown here: autotune's default "
        f"{DEFAULT_TOTAL_STEPS} prices the run, the export keeps -1",
        f"{KEY}: -1 (the dataset's length) cannot be counted from the config here: "
        f"train.total_steps is left null, a study prices autotune's default {DEFAULT_TOTAL_STEPS} "
        "and the export keeps -1 (MindFormers counts it); pass --total-steps T for your run's "
        "length",
    )
