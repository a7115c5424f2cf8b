"""Writing what a user keeps: strict JSON values, and files and folders that appear whole or not
at all.

Contract:
- :func:`json_safe` returns a value JSON can hold as it is: non-finite floats (NaN, ±inf, which
  strict JSON and Optuna's storage of user attrs do not have) become None, in dicts, lists and
  tuples too (tuples become lists).
- :func:`write_text` writes a text file whole or not at all: the text goes to a temporary file
  beside it (a fresh name, ``mkstemp``'s: processes that write the same file — on one host or on
  several nodes sharing the folder — never share one), which then replaces ``path`` in one
  rename; a reader never sees half a file, and one that opened the old file keeps reading it
  whole. :func:`write_json` writes JSON so (a value JSON cannot hold leaves ``path`` as it was).
- :func:`staged_folder` is a context manager giving a new private folder beside ``out``; when
  the block ends normally the folder replaces ``out`` (an existing ``out`` — a folder, or
  anything else — is kept until the new one is in place, then removed), and when it raises the staged folder is removed and
  ``out`` is left as it was. The caller checks beforehand whether ``out`` may be replaced.
- :func:`folder_once` makes a folder that is the same whoever makes it: filled in a private
  folder beside ``out`` and renamed into place unless ``out`` exists — writers racing for it
  (the nodes of a trial on a folder they share) all use the first one made, whole.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path


def json_safe(value):
    """``value`` with every non-finite float as None (see the module doc)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def write_text(path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path``, atomically (see the module doc)."""
    path = Path(path)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(temporary, 0o644)  # mkstemp makes it private; the result is an ordinary file
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def write_json(path, value, indent: int | None = None) -> None:
    """Write ``value`` as JSON (``json.dumps(value, indent=indent)``) to ``path``, atomically
    (see the module doc)."""
    write_text(path, json.dumps(value, indent=indent))


@contextmanager
def staged_folder(out: Path):
    """Yield a folder to fill; it becomes ``out`` when the block succeeds (see the module doc)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    staged = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        staged.chmod(0o755)  # mkdtemp makes it private; the result is an ordinary folder
        yield staged
        if out.exists() and not (out.is_dir() and not any(out.iterdir())):
            # keep what was there until the new folder is in place
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
            os.replace(out, old / out.name)
            os.replace(staged, out)
            shutil.rmtree(old)
        else:
            os.replace(staged, out)  # an empty folder is replaced atomically
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise


def folder_once(out: Path, fill) -> Path:
    """``out``, made by ``fill(folder)`` unless it exists (see the module doc)."""
    out = Path(out)
    if out.is_dir():
        return out
    staged = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        staged.chmod(0o755)  # mkdtemp makes it private; the result is an ordinary folder
        fill(staged)
        os.rename(staged, out)
    except OSError:
        if not out.is_dir():  # not another writer's, in place first: a failure of ours
            raise
    finally:
        shutil.rmtree(staged, ignore_errors=True)
    return out
