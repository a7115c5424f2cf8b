"""Reading a MindFormers config file as MindFormers reads it (no MindFormers import).

Contract (docs/mindformers.md, "The merge: base_config"):
- :func:`load_config` reads a MindFormers config as ``MindFormerConfig._file2dict`` does
  (``mindformers/tools/register/config.py``): ``yaml.safe_load``, then each ``base_config`` (a
  path or a list of paths, relative to the including file's folder) loaded the same way, several
  bases combined with a shallow ``dict.update``, and the file merged over them by :func:`merge`.
  A key given twice in one mapping keeps its last value, as ``yaml.safe_load`` does; each such
  key is one line in ``warnings`` (when given), naming the file and the key. Any other problem
  is a :class:`SpecError` naming the file (and the key).
- :func:`merge` is MindFormers' ``_merge_a_into_b``: a mapping merges into a mapping (or into
  null) key by key, anything else replaces. Where MindFormers' own rule would crash — a mapping
  over a scalar or a list — it raises :class:`MergeConflict`, or with ``replace=True`` replaces
  the value whole. It returns the merged dict and every leaf it changed.
- :func:`is_mcore` says whether MindFormers builds a config's model on its mcore path.

`autotune init --mindformers` reads configs through it (`autotune.spec.mindformers_config`) and
`autotune export` merges the tuned settings into one (`autotune.mindformers.config`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from autotune.spec.errors import SpecError
from autotune.spec.yaml_file import load_yaml

BASE_CONFIG = "base_config"
_ABSENT = object()


class MergeConflict(Exception):
    """MindFormers' merge would crash at ``key``: a mapping over a scalar or a list."""

    def __init__(self, key: str, old):
        super().__init__(f"{key}: a mapping cannot be merged over {json.dumps(old)}")
        self.key, self.old = key, old


def _same(old, new) -> bool:
    if isinstance(old, bool) or isinstance(new, bool):
        return type(old) is type(new) and old == new
    if isinstance(old, (int, float)) and isinstance(new, (int, float)):
        return old == new
    return type(old) is type(new) and old == new


def merge(a: dict, b: dict | None, replace: bool = False, _path: str = "") -> tuple[dict, list]:
    """``a`` merged over ``b`` by MindFormers' ``_merge_a_into_b``; returns (merged, changes)
    with each change ``{"key": dotted, "old": value, "new": value}`` (no "old": it was absent)."""
    # MindFormers: b = b.copy() if b is not None else a.copy()
    merged = dict(b) if b is not None else dict(a)
    changes = []
    for key, value in a.items():
        dotted = f"{_path}{key}"
        old = b.get(key, _ABSENT) if b is not None else _ABSENT
        if isinstance(value, dict) and key in merged:
            if b is None or isinstance(old, dict):
                merged[key], inner = merge(
                    value, old if isinstance(old, dict) else None, replace, f"{dotted}."
                )
                changes += inner
                continue
            if old is not None and not replace:  # MindFormers: `old.copy()[k] = …` fails
                raise MergeConflict(dotted, old)
        merged[key] = value  # over null MindFormers' merge also gives the mapping itself
        if old is _ABSENT:
            changes.append({"key": dotted, "new": value})
        elif not _same(old, value):
            changes.append({"key": dotted, "old": old, "new": value})
    return merged, changes


def is_mcore(config: dict) -> bool:
    """Whether MindFormers builds ``config``'s model on its mcore path (``use_legacy: False``;
    a config that does not say is legacy: ``config.get('use_legacy', True)`` in MindFormers'
    ``tools/register/template.py``)."""
    return config.get("use_legacy", True) is False


def load_config(path: str | os.PathLike, warnings: list | None = None, _seen: tuple = ()) -> dict:
    """A MindFormers config with its base_config chain resolved (see the module doc)."""
    path = Path(path)
    real = path.resolve()
    if real in _seen:
        raise SpecError(f"{path}: base_config includes itself ({' -> '.join(map(str, _seen))})")
    repeated = []
    data = load_yaml(real, repeated)
    if warnings is not None:
        warnings += [
            f"{path}: {line}, as MindFormers' yaml.safe_load keeps it" for line in repeated
        ]
    if BASE_CONFIG not in data:
        return data
    names = data.pop(BASE_CONFIG)
    names = names if isinstance(names, list) else [names]
    combined = {}
    for name in names:
        if not isinstance(name, str) or not name:
            raise SpecError(f"{path}: base_config: expected a file name, got {name!r}")
        # MindFormers joins the name to the including file's folder as given (not resolved).
        base = os.path.join(os.path.dirname(path), name)
        combined.update(load_config(base, warnings, (*_seen, real)))
    try:
        return merge(data, combined)[0]
    except MergeConflict as exc:
        raise SpecError(
            f"{path}: MindFormers cannot merge it over its base_config: {exc}"
        ) from None
