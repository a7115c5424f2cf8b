"""Export a tuned trial as a MindSpore training job: strategy files, launch.sh, launch.yaml,
mindformers.yaml, summary.json and optionally a resharded checkpoint (see :func:`write_export`)."""

from autotune.export.writer import write_export

__all__ = ["write_export"]
