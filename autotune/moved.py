"""Modules that moved, still importable by their old names (with a DeprecationWarning).

Contract: :data:`MOVED` maps a module's old dotted name to its new one. Importing ``autotune``
puts a finder on ``sys.meta_path`` under which ``import <old>`` (and ``from <old> import x``)
gives the new module itself — the same object, so a user's ``model.entry`` module written
against an old name keeps working — and warns once per old name that it moved. Two old modules
became packages of the same name (``autotune.train.parallel``, ``autotune.train.step``): their
old names are served by the packages' own ``__getattr__`` (:func:`forward`).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

MOVED = {
    "autotune.costmodel.timing": "autotune.costmodel.step_time",
    "autotune.execution.timing": "autotune.execution.launch_time",
    "autotune.export.mindformers": "autotune.mindformers.config",
    "autotune.export.mindformers_base": "autotune.mindformers.base",
    "autotune.storage.opening": "autotune.storage.connection",
    "autotune.train.compile_cache": "autotune.train.runtime.compile_cache",
    "autotune.train.data": "autotune.train.models.data",
    "autotune.train.device": "autotune.train.runtime.device",
    "autotune.train.device_smi": "autotune.train.runtime.device_smi",
    "autotune.train.engine": "autotune.train.step.engine",
    "autotune.train.entry": "autotune.train.models.entry",
    "autotune.train.fused": "autotune.train.models.fused",
    "autotune.train.lifetime": "autotune.train.runtime.lifetime",
    "autotune.train.llama": "autotune.train.models.llama",
    "autotune.train.parallel": "autotune.train.parallel.groups",
    "autotune.train.pipeline": "autotune.train.parallel.pipeline",
    "autotune.train.probe": "autotune.train.step.probe",
    "autotune.train.schedule": "autotune.train.step.schedule",
    "autotune.train.serve": "autotune.train.runtime.serve",
    "autotune.train.session": "autotune.train.runtime.session",
    "autotune.train.sharding": "autotune.train.parallel.sharding",
    "autotune.train.step": "autotune.train.step.train_step",
    "autotune.train.tp_layers": "autotune.train.parallel.tp_layers",
    "autotune.train.weights": "autotune.train.models.weights",
}
# old modules that are packages of the same name now: the packages serve their old attributes
BECAME_PACKAGES = ("autotune.train.parallel", "autotune.train.step")


def _say(old: str, stacklevel: int) -> None:
    warnings.warn(
        f"{old} moved to {MOVED[old]}; import it from there (the old name will go)",
        DeprecationWarning,
        stacklevel=stacklevel + 1,
    )


class _OldNames(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old name and loads it as the new module (``sys.modules`` holds the new one)."""

    def find_spec(self, name, path=None, target=None):
        if name in MOVED and name not in BECAME_PACKAGES:
            return importlib.util.spec_from_loader(name, self)
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        # the import system hands back whatever sys.modules holds under the name once this returns
        _say(module.__name__, 2)
        sys.modules[module.__name__] = importlib.import_module(MOVED[module.__name__])


def forward(package: str, name: str):
    """An attribute of the module ``package`` was before it became a package (its
    ``__getattr__``): the same attribute of the module it moved to, with the warning."""
    new = importlib.import_module(MOVED[package])
    if not hasattr(new, name):
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    _say(package, 3)  # the caller of the package's __getattr__
    return getattr(new, name)


def install() -> None:
    """Put the finder on ``sys.meta_path`` once (importing ``autotune`` does)."""
    if not any(isinstance(f, _OldNames) for f in sys.meta_path):
        sys.meta_path.insert(0, _OldNames())
