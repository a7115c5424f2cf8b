"""Reading a YAML mapping the user wrote: ``yaml.safe_load`` only, and every problem a SpecError.

Contract: :func:`load_yaml` returns the mapping in ``path`` or raises
`autotune.spec.errors.SpecError` naming the file (and the line and column, where YAML knows
them): a file that cannot be read or is not UTF-8 text, invalid YAML — every error PyYAML
raises (reader, scanner, parser, composer, constructor: a tag the safe loader does not build,
such as ``!!python/object/apply``, is refused and nothing is built), and a value its tag cannot
hold (``2001-13-45``) — a document that is not a mapping, a
key given twice in one mapping (``safe_load`` would silently keep the last), or a document
whose aliases expand it past :data:`NODE_BUDGET` nodes, or into itself. The document is composed
once and each node walked once, however many aliases refer to it, so an alias bomb (nine levels
of nine-fold aliases: a few hundred bytes, 387 million nodes expanded) is refused in
milliseconds — accepted, it would explode later wherever the data is walked or written out (the
fingerprint, a trial's ``config.json``).

A file autotune reads as another program reads it (a MindFormers config: ``yaml.safe_load``,
which keeps the last of a repeated key) passes ``repeated``, a list: a key given twice is then
not refused but appended to it as one line naming the key's dotted path and line, and the last
value wins, as in that program.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from autotune.spec.errors import SpecError

# Nodes a document may hold once its aliases are expanded: a model.yaml or a MindFormers config
# holds hundreds to a few thousand.
NODE_BUDGET = 1_000_000


class _SafeLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` whose constructors' own failures (a value its tag cannot hold: a
    13th month, ``!!int x``) are YAML errors at the node's place, as its others are."""

    def construct_object(self, node, deep=False):
        try:
            return super().construct_object(node, deep=deep)
        except (ValueError, OverflowError) as exc:
            raise yaml.constructor.ConstructorError(None, None, str(exc), node.start_mark) from None


def _invalid(path: Path, text: str, exc: yaml.YAMLError) -> SpecError:
    """``path: not valid YAML (line L, column C): problem`` for any error PyYAML raises."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    if isinstance(exc, yaml.reader.ReaderError):  # a character: where, by its position
        before = text[: exc.position]
        line, column = before.count("\n"), exc.position - (before.rfind("\n") + 1)
        problem = (
            f"unacceptable character #x{exc.character:04x}: special characters are not allowed"
            if isinstance(exc.character, int)
            else exc.reason
        )
    else:
        line, column = (mark.line, mark.column) if mark is not None else (None, None)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    where = f" (line {line + 1}, column {column + 1})" if line is not None else ""
    return SpecError(f"{path}: not valid YAML{where}: {problem}")


def load_yaml(path: Path, repeated: list | None = None) -> dict:
    """safe_load a YAML mapping (see the module doc); ``repeated``: where a repeated key is
    reported instead of refused."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise SpecError(f"{path}: not a text (UTF-8) file") from None
    try:
        loader = _SafeLoader(text)  # the reader checks every character here
    except yaml.YAMLError as exc:
        raise _invalid(path, text, exc) from None
    try:
        try:
            root = loader.get_single_node()  # nodes only, never Python objects
        except yaml.YAMLError as exc:
            raise _invalid(path, text, exc) from None
        except RecursionError:
            raise SpecError(f"{path}: nested too deeply to read") from None
        if not isinstance(root, yaml.MappingNode):
            raise SpecError(f"{path}: must be a YAML mapping")
        _check_nodes(path, root, repeated)
        try:  # the checked nodes, by the safe constructors: never a Python object of a tag
            return loader.construct_document(root)
        except yaml.YAMLError as exc:
            raise _invalid(path, text, exc) from None
    finally:
        loader.dispose()


def _children(node) -> list:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return list(node.value) if isinstance(node, yaml.SequenceNode) else []


def _check_nodes(path: Path, root, repeated: list | None = None) -> None:
    """Walk each node of the composed document once (an alias is the node it names): refuse (or
    report in ``repeated``) a key given twice in one mapping; refuse a node that contains itself
    and an expanded size over :data:`NODE_BUDGET`."""
    expanded: dict[int, int] = {}  # id(node) → nodes under it, aliases expanded (itself included)
    open_nodes: set[int] = set()  # walked into, not finished: the ancestors of the current one
    stack = [(root, False, "")]  # (node, finished, the dotted path of the first way to it)
    while stack:
        node, finished, where = stack.pop()
        if finished:
            open_nodes.discard(id(node))
            expanded[id(node)] = 1 + sum(expanded[id(child)] for child in _children(node))
            if expanded[id(node)] > NODE_BUDGET:
                raise SpecError(
                    f"{path}: its aliases expand it to more than {NODE_BUDGET:,} "
                    "YAML nodes (the node budget; a model.yaml holds a few hundred)"
                )
            continue
        if id(node) in expanded:
            continue
        if id(node) in open_nodes:
            raise SpecError(
                f"{path}: line {node.start_mark.line + 1}: an alias refers to a node "
                "that contains it (the document would be infinite)"
            )
        children = []
        if isinstance(node, yaml.MappingNode):
            seen = set()
            for key, value in node.value:
                dotted = f"{where}{key.value}" if isinstance(key, yaml.ScalarNode) else where
                if isinstance(key, yaml.ScalarNode) and key.value in seen:
                    line = key.start_mark.line + 1
                    if repeated is None:
                        raise SpecError(
                            f"{path}: line {line}: {key.value!r} is given twice in one "
                            "mapping (YAML would silently keep the last)"
                        )
                    repeated.append(
                        f"{dotted}: given more than once in one mapping (again on line {line}): "
                        "the last value is kept"
                    )
                seen.add(key.value if isinstance(key, yaml.ScalarNode) else id(key))
                children += [(key, where), (value, f"{dotted}.")]
        else:
            children = [(child, where) for child in _children(node)]
        open_nodes.add(id(node))
        stack.append((node, True, where))
        stack.extend((child, False, at) for child, at in children)
