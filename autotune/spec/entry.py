"""The one loader of a ``model.entry`` network: validation (`autotune.spec.model_section`), export
(`autotune.export.params`) and the trial program (`autotune.train.models.entry`) import the user's
function through here, by one rule.

Contract:
- An entry is ``"pkg.module:function"`` or ``"path/file.py:function"``, the path relative to
  model.yaml's folder or absolute. :func:`resolve` makes a file entry's path absolute against
  that folder (what the spec keeps and a trial's config carries).
- :func:`import_dirs` are the folders an entry imports from: model.yaml's folder (``base``;
  None for a config written without one), then a file entry's own folder. Wherever the entry is loaded they come first on ``sys.path`` (a trial also
  gets them through its PYTHONPATH: `autotune.execution.runner`), so ``entry: "mymodel:build"``
  beside model.yaml, or a file that imports its neighbours, loads alike in all three places.
- :func:`load` imports the entry that way and returns the function. A file entry becomes the
  module :data:`USER_MODULE` (MindSpore's graph compiler looks sources up through
  ``sys.modules``). Any failure — a malformed entry, a missing file, an exception of the user's
  code while importing, no such callable — is an :class:`EntryError` naming the entry.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

USER_MODULE = "autotune_user_model"  # module name of an entry loaded from a file path


class EntryError(ValueError):
    """``model.entry`` cannot be loaded, or what it built breaks the contract (an input error)."""


def _split(entry: str) -> tuple[str, str]:
    module, sep, function = str(entry).rpartition(":")
    if not sep or not module or not function:
        raise EntryError(
            f"model.entry: {entry!r} is not 'pkg.module:function' or 'path/file.py:function'"
        )
    return module, function


def _is_file(module: str) -> bool:
    return module.endswith(".py") or "/" in module


def resolve(entry: str, base: str | Path | None) -> str:
    """``entry`` with a file's path made absolute against ``base`` (model.yaml's folder)."""
    module, function = _split(entry)
    if _is_file(module):
        module = str((Path(base or ".") / module).resolve())
    return f"{module}:{function}"


def import_dirs(entry: str, base: str | Path | None) -> list[str]:
    """The folders ``entry`` imports from (see the module doc), absolute."""
    module, _ = _split(resolve(entry, base))
    dirs = [str(Path(base).resolve())] if base is not None else []
    if _is_file(module) and str(Path(module).parent) not in dirs:
        dirs.append(str(Path(module).parent))
    return dirs


def load(entry: str, base: str | Path | None):
    """The function ``entry`` names, imported by the module doc's rule."""
    module_name, function = _split(resolve(entry, base))
    for folder in reversed(import_dirs(entry, base)):
        if folder not in sys.path:
            sys.path.insert(0, folder)
    try:
        if _is_file(module_name):
            if not Path(module_name).is_file():
                raise EntryError(f"model.entry: no such file {module_name}")
            loader = importlib.util.spec_from_file_location(USER_MODULE, module_name)
            module = importlib.util.module_from_spec(loader)
            sys.modules[USER_MODULE] = module
            loader.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except EntryError:
        raise
    except Exception as exc:  # the user's code: any failure is their input error
        raise EntryError(
            f"model.entry: importing {module_name} failed: {type(exc).__name__}: {exc}"
        ) from None
    found = getattr(module, function, None)
    if not callable(found):
        raise EntryError(f"model.entry: {module_name} has no callable {function!r}")
    return found
