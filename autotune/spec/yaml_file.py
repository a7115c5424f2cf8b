"""Reading a YAML mapping the user wrote: ``yaml.safe_load`` only, and every problem a SpecError.

Contract: :func:`load_yaml` returns the mapping in ``path`` or raises
`autotune.spec.errors.SpecError` naming the file (and the line, where YAML knows it): a file
that cannot be read or is not UTF-8 text, invalid YAML, a document that is not a mapping, a
key given twice in one mapping (``safe_load`` would silently keep the last), or a document
whose aliases expand it past :data:`NODE_BUDGET` nodes, or into itself. The document is composed
once and each node walked once, however many aliases refer to it, so an alias bomb (nine levels
of nine-fold aliases: a few hundred bytes, 387 million nodes expanded) is refused in
milliseconds — accepted, it would explode later wherever the data is walked or written out (the
fingerprint, a trial's ``config.json``).
"""

from __future__ import annotations

from pathlib import Path

import yaml

from autotune.spec.errors import SpecError

# Nodes a document may hold once its aliases are expanded: a model.yaml or a MindFormers config
# holds hundreds to a few thousand.
NODE_BUDGET = 1_000_000


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
        root = yaml.compose(text, Loader=yaml.SafeLoader)  # nodes only, never Python objects
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise SpecError(f"{path}: not valid YAML{where}: {getattr(exc, 'problem', exc)}") from None
    except RecursionError:
        raise SpecError(f"{path}: nested too deeply to read") from None
    if not isinstance(root, yaml.MappingNode):
        raise SpecError(f"{path}: must be a YAML mapping")
    _check_nodes(path, root)
    return yaml.safe_load(text)


def _children(node) -> list:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return list(node.value) if isinstance(node, yaml.SequenceNode) else []


def _check_nodes(path: Path, root) -> None:
    """Walk each node of the composed document once (an alias is the node it names): refuse a
    key given twice in one mapping, a node that contains itself, and an expanded size over
    :data:`NODE_BUDGET`."""
    expanded: dict[int, int] = {}  # id(node) → nodes under it, aliases expanded (itself included)
    open_nodes: set[int] = set()   # walked into, not finished: the ancestors of the current one
    stack = [(root, False)]
    while stack:
        node, finished = stack.pop()
        if finished:
            open_nodes.discard(id(node))
            expanded[id(node)] = 1 + sum(expanded[id(child)] for child in _children(node))
            if expanded[id(node)] > NODE_BUDGET:
                raise SpecError(f"{path}: its aliases expand it to more than {NODE_BUDGET:,} "
                                "YAML nodes (the node budget; a model.yaml holds a few hundred)")
            continue
        if id(node) in expanded:
            continue
        if id(node) in open_nodes:
            raise SpecError(f"{path}: line {node.start_mark.line + 1}: an alias refers to a node "
                            "that contains it (the document would be infinite)")
        if isinstance(node, yaml.MappingNode):
            seen = set()
            for key, _ in node.value:
                if isinstance(key, yaml.ScalarNode):
                    if key.value in seen:
                        raise SpecError(f"{path}: line {key.start_mark.line + 1}: {key.value!r} "
                                        "is given twice in one mapping (YAML would silently "
                                        "keep the last)")
                    seen.add(key.value)
        open_nodes.add(id(node))
        stack.append((node, True))
        stack.extend((child, False) for child in _children(node))
