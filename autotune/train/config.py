"""The config a trial program reads: made here, next to the program that reads it.

Contract: :func:`trial_config` is the one writer of the ``config.json`` format described in
this package's docstring; the search loop uses it for trials and export for the full-length run.
A config the program cannot run raises :class:`ConfigError`; :func:`micro_steps` is how many
micro-batches one optimizer step of a config's knobs takes.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from autotune.spec.knobs import micro_steps as knobs_micro_steps

# A trial's steps, applied or skipped, stop at UPDATE_CAP × trial.steps (a scale that keeps
# overflowing): autotune's trainer and a MindFormers trial's recorder alike.
UPDATE_CAP = 2


class ConfigError(ValueError):
    """The config cannot be run by the trial program (exit code 2)."""


def micro_steps(knobs: dict) -> int:
    """Micro-batches per optimizer step: ``micro_batches`` with pipeline stages, else ``grad_accum``."""
    return knobs_micro_steps(
        pp=knobs["pp"], micro_batches=knobs["micro_batches"], grad_accum=knobs["grad_accum"]
    )


def trial_config(
    spec,
    candidate,
    *,
    study: str,
    number: int,
    out_dir: str | Path,
    steps: int,
    measure_after: int,
    stop_rule: dict | None = None,
    backend: str | None = None,
    device_memory: dict | None = None,
    compile_cache: str | Path | None = None,
) -> dict:
    """``config.json`` for ``candidate`` of ``spec``: ``steps`` optimizer steps, timing after
    ``measure_after`` — with ``stop_rule`` (``precision``, ``min_steps``:
    `autotune.spec.model_yaml.Spec.stop_rule`) fewer, once the step time is known well enough
    (`autotune.train.program`) — outputs in ``out_dir`` (kept as given: export writes a
    relative one). An entry model's config also names ``model_dir``, model.yaml's folder, from
    which the entry is imported (`autotune.spec.entry`). ``device_memory`` (GPU/Ascend: ``size_gb``,
    ``max_size_gb``, `autotune.costmodel.device_memory_cap`) caps the device's memory pool
    (`autotune.train.runtime.device`). ``compile_cache``: the folder of compiled graphs trials may
    reuse (`autotune.train.runtime.compile_cache`)."""
    config = {
        "study": study,
        "trial_number": number,
        "backend": backend or spec.cluster.backend,
        "seed": spec.search.seed or 0,
        "out_dir": str(out_dir),
        "model": spec.model.as_config(),
        "train": asdict(spec.train),
        "trial": {"steps": steps, "measure_after": measure_after, **(stop_rule or {})},
        "knobs": candidate.as_dict(),
    }
    if device_memory:
        config["device_memory"] = dict(device_memory)
    if compile_cache:
        config["compile_cache"] = str(compile_cache)
    if spec.model.entry:
        config["model_dir"] = str(Path(spec.source).resolve().parent)
    return config
