"""Reading a YAML mapping the user wrote: ``yaml.safe_load`` only, and every problem a SpecError.

Contract: :func:`load_yaml` returns the mapping in ``path`` or raises
`autotune.spec.errors.SpecError` naming the file (and the line, where YAML knows it): a file
that cannot be read or is not UTF-8 text, invalid YAML, a document that is not a mapping, or a
key given twice in one mapping (``safe_load`` would silently keep the last).
"""

from __future__ import annotations

from pathlib import Path

import yaml

from autotune.spec.errors import SpecError


def load_yaml(path: Path) -> dict:
    """safe_load a YAML mapping (see the module doc)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise SpecError(f"{path}: not a text (UTF-8) file") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise SpecError(f"{path}: not valid YAML{where}: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(data, dict):
        raise SpecError(f"{path}: must be a YAML mapping")
    duplicate = _duplicate_key(text)
    if duplicate:
        raise SpecError(f"{path}: line {duplicate[1]}: {duplicate[0]!r} is given twice in one "
                        "mapping (YAML would silently keep the last)")
    return data


def _duplicate_key(text: str) -> tuple[str, int] | None:
    """The first key given twice in one mapping, with its line. Composing builds nodes only,
    never Python objects."""
    stack = [yaml.compose(text, Loader=yaml.SafeLoader)]
    while stack:
        node = stack.pop()
        if isinstance(node, yaml.MappingNode):
            seen = set()
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode):
                    if key.value in seen:
                        return key.value, key.start_mark.line + 1
                    seen.add(key.value)
                stack.append(value)
        elif isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)
    return None
