"""autotune: find the fastest stable way to train a MindSpore model on a device pool."""

__version__ = "0.1.0"

from autotune import moved as _moved

_moved.install()  # modules that moved stay importable by their old names


def trials_frame(study, storage=None):
    """One row per trial of a study, knobs and metrics as columns (see autotune.analysis.frames)."""
    from autotune.analysis.frames import trials_frame as frame

    return frame(study, storage)


def compare(studies, storage=None):
    """All trials of several studies in one DataFrame (see autotune.analysis.frames)."""
    from autotune.analysis.frames import compare as stacked

    return stacked(studies, storage)
