"""A synthetic dataset for MindFormers trials (``trial.data: synthetic``).

Contract: :func:`synthetic_dataset` returns the path of a MindRecord of random tokens shaped as
the study's MindFormers config reads them — its ``train_dataset.input_columns``, each row
``model.seq_length`` + 1 tokens of ``model.vocab_size`` (the model slices inputs and labels out
of it), or ``seq_length`` tokens where its ``model_config.input_sliced_sig`` says the dataset is
sliced already and the model takes it so — an mcore model's ``GPTModel`` always, the legacy
llama when a ``labels`` column comes with the inputs (``LlamaForCausalLM.construct``) — with
rows enough for every step of a
trial in one epoch (global batch × (``UPDATE_CAP`` × ``trial.steps`` + 1)), so that no epoch
boundary falls inside the steps a trial measures. It is written once per shape under ``root``
(then reused by every trial and study of that shape) by MindFormers' own interpreter
(`autotune.mindformers.CLUSTER_DIR`, ``autotune_mf_data.py``: the MindSpore that reads it writes
it), into a folder that appears whole or not at all (`autotune.files.staged_folder`). Random tokens give a loss near
ln(vocab) that does not fall: a ``final_loss`` objective means nothing on them, and overflow
behaves as on random data (docs/mindformers.md, "Data").
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from autotune.files import staged_folder
from autotune.mindformers import CLUSTER_DIR
from autotune.spec.errors import SpecError
from autotune.spec.mindformers_file import load_config
from autotune.spec.specs import Spec
from autotune.train.config import UPDATE_CAP

DATA_FILE = "tokens.mindrecord"
WRITE_TIMEOUT_S = 1800


class DataError(SpecError):
    """The synthetic dataset could not be written (its writer's last words)."""


def dataset_shape(spec: Spec) -> tuple[int, int, int, list[str]]:
    """``(rows, tokens per row, vocabulary, columns)`` of ``spec``'s synthetic dataset."""
    config = load_config(spec.mindformers_base)
    columns = (config.get("train_dataset") or {}).get("input_columns") or ["input_ids"]
    rows = spec.train.global_batch_size * (UPDATE_CAP * spec.trial.steps + 1)
    model_config = (config.get("model") or {}).get("model_config") or {}
    sliced = model_config.get("input_sliced_sig") is True and (
        config.get("use_legacy", True) is False or "labels" in columns
    )
    tokens = spec.model.seq_length + (0 if sliced else 1)
    return rows, tokens, spec.model.vocab_size, [str(c) for c in columns]


def synthetic_dataset(spec: Spec, root: Path) -> str:
    """The MindRecord for ``spec``'s trials under ``root`` (see the module doc)."""
    rows, tokens, vocab, columns = dataset_shape(spec)
    folder = root / f"tokens-{tokens}x{rows}-vocab{vocab}-{'-'.join(columns)}"
    if (folder / DATA_FILE).is_file():
        return str(folder / DATA_FILE)
    script = CLUSTER_DIR / "autotune_mf_data.py"
    with staged_folder(folder) as staged:
        args = [str(staged / DATA_FILE), str(rows), str(tokens), str(vocab), *columns]
        done = subprocess.run(
            [spec.trial.python, str(script), *args],
            capture_output=True,
            text=True,
            timeout=WRITE_TIMEOUT_S,
        )
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise DataError(f"writing the synthetic dataset {folder} failed: {last}")
    return str(folder / DATA_FILE)
