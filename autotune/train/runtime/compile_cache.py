"""MindSpore's compile cache, one entry per graph: a compiled graph is reused only by a trial
that compiles the same graph.

MindSpore 2.10 caches a compiled graph as ``<MS_COMPILER_CACHE_PATH>/rank_<r>/graph_cache/
<role>compile_cache_<i>.mindir`` (on Ascend with its backend's half beside it,
``<role>backend_compile_cache_<i>.mindir``, ``.json`` and ``_backinfo.json``; every file of graph
``i`` is stored and placed together): ``i`` counts the graphs the *process* has compiled so far, the
folder is read once per process, and what it checks before loading is a hash of the entry
script's source (``compile_dependency.hash``), not the graph — measured, a cached recompute=full
graph ran in place of recompute=none, and graphs compiled in another order loaded each other's
files. Also measured: the first compile that finds no file in its slot turns loading off for
the rest of the process, while a file that fails to load is only a miss (the graph compiles in
full and MindSpore writes it there). docs/mindspore-cpu.md, "Compile cache", has the commands.
So MindSpore's folder is used here as a slot, never as a store:

- :func:`install` (once per process, before its first compile) points MindSpore at a folder of
  this process's own, writes the dependency hash MindSpore expects there (computed as MindSpore
  computes it, from its own list of dependency files), and wraps MindSpore's two compile entry
  points (``_CellGraphExecutor.compile``, ``_JitExecutor.compile``) to count the graphs compiled:
  the count is MindSpore's ``i``. The slot of the next graph always holds a *placeholder*, a
  file that is no graph: a graph with nothing stored is a miss, never the end of loading.
- :meth:`GraphCache.trial` names the graph keys of the trial about to build its graphs: a hash of
  everything in the trial's config that can change a graph (:func:`graph_key`: the config less
  the fields no graph holds), MindSpore's version and the source of the whole ``autotune``
  package (every module a trial process can import, by path and content: a value any of them
  puts into a graph — `autotune.spec.knobs.SCALE_WINDOW`, `autotune.spec.backends`' fused
  attention — is in the key, wherever the module lives); and its
  *update-free* key, the same less the knobs that act in the optimizer update only
  (`autotune.spec.knobs.Knob.graphs` "update": the parallel optimizer), for the cells whose class
  says ``update_free = True`` (a forward and backward that accumulates, a pipeline stage's cells):
  trials that differ only in those knobs share these graphs and compile only their update. Which
  knobs no graph holds, or only the update, is measured (docs/mindspore-cpu.md, "Compile cache":
  such a graph stored under other values is the same MindIR but for MindSpore's node counters,
  and the fusion threshold buckets the all-reduces in MindSpore's backend, after a load). The n-th
  graph a trial compiles is stored under (key, n, signature): the signature is the compiled
  cell's class, its parameters (names, shapes, dtypes) and its inputs (shapes, dtypes). Just
  before a cell's first compile, the matching entry (if any) is *copied* over the placeholder;
  just after, a graph MindSpore wrote into the slot (a miss) is moved into the store; an entry
  left as it was placed was loaded (a hit).
- A trial without a key (a model.entry network: its source is the user's, outside the key;
  PyNative) stores and loads nothing. A file MindSpore writes for another index than the count
  turns the cache off for the rest of the process (one line on stderr), so a count gone wrong
  can never load a wrong graph; so does any I/O failure of the cache's own (a full disk, a
  store it cannot write, an entry another process replaced while it was copied): the slots are
  emptied, so MindSpore's next compile finds no file and stops loading, and the trial runs as it
  would without the cache. :func:`install` that cannot make its folder returns None (no cache).

Hits and stores are said on stderr (``autotune.train compile cache: …``); MindSpore's own line
for a load is "Use the compilation cache and execute the backend actions only", for a miss
"Failed to load the compilation cache file" after an ERROR "Load MindIR file failed" (the
placeholder; both are seen with ``GLOG_v=2``, the ERROR also at the trials' ``GLOG_v=3``).
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import json
import os
import re
import shutil
import socket
import sys
from pathlib import Path

from autotune.files import staged_folder
from autotune.spec.knobs import KNOBS

# Fields of a trial config that no compiled graph holds: where it writes, who it is, the
# weights' seed (weights are bound by name when a cached graph loads), the steps excluded from
# timing, when the trial may stop measuring, the learning-rate schedule's numbers (Parameters'
# values: `autotune.train.step.schedule`), the trial's and the run's lengths (only the schedule reads
# them), the checkpoint interval, and the knobs no graph holds (`Knob.graphs` "none": the initial
# loss scale, the warmup, the fusion threshold).
NEUTRAL = {
    "study",
    "trial_number",
    "out_dir",
    "seed",
    "compile_cache",
    "model_dir",
    ("trial", "measure_after"),
    ("trial", "steps"),
    ("trial", "precision"),
    ("trial", "min_steps"),
    ("train", "learning_rate"),
    ("train", "total_steps"),
    ("train", "save_every"),
} | {("knobs", name) for name, knob in KNOBS.items() if knob.graphs == "none"}
SAY = "autotune.train compile cache:"
# A file MindSpore writes for graph <index> of the process: the front end's
# ``<role>compile_cache_<i>.mindir`` and, where a backend caches its kernel graph too (Ascend),
# ``<role>backend_compile_cache_<i>`` + ``.mindir``, ``.json`` and ``_backinfo.json``
# (compile_cache_manager.cc, GetBackendCompileCachePathWithoutExtension; kernel_graph_mgr.cc,
# CacheKernelGraph): the index, then a suffix that starts with "." or "_".
_SLOT = re.compile(r"^(?P<head>.*?)_(?P<index>\d+)(?P<tail>([._].*)?)$")


# The knobs a graph without the optimizer update does not hold (`Knob.graphs` "update").
UPDATE_ONLY = {("knobs", name) for name, knob in KNOBS.items() if knob.graphs == "update"}


def graph_key(cfg: dict, update_free: bool = False) -> str:
    """The hash of everything in ``cfg`` that can change a compiled graph (see the module doc);
    ``update_free``: of a graph that holds no part of the optimizer update."""
    neutral = NEUTRAL | UPDATE_ONLY if update_free else NEUTRAL
    kept = {}
    for section, value in cfg.items():
        if section in neutral:
            continue
        if isinstance(value, dict):
            value = {k: v for k, v in value.items() if (section, k) not in neutral}
        kept[section] = value
    if update_free:
        kept["update_free"] = True  # never the key of a whole trial's graphs
    digest = hashlib.sha256(json.dumps(kept, sort_keys=True).encode())
    digest.update(_program_digest())
    return digest.hexdigest()[:24]


@functools.cache
def _program_digest() -> bytes:
    """MindSpore's version and the source of every module of the ``autotune`` package (its
    relative path and content), hashed once per process: the code this process runs is what it
    imported, whatever the files say later. The whole package, not a list of modules: a module
    the trial program imports is keyed wherever it is moved (measured: ~110 files, a few ms)."""
    import mindspore as ms

    digest = hashlib.sha256(ms.__version__.encode())
    # the package's folder, found from this module's own name and file wherever it sits
    root = Path(__file__).resolve().parents[__name__.count(".") - 1]
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.digest()


def _signature(obj, args) -> str:
    """The compiled cell's class, parameters and inputs, as a short hash."""

    def shape_of(value):
        if hasattr(value, "shape") and hasattr(value, "dtype"):
            return [list(value.shape), str(value.dtype)]
        if isinstance(value, (tuple, list)):
            return [shape_of(v) for v in value]
        return type(value).__name__

    params = [
        (name, list(p.shape), str(p.dtype))
        for name, p in (obj.parameters_dict().items() if hasattr(obj, "parameters_dict") else [])
    ]
    text = json.dumps(
        [type(obj).__module__ + "." + type(obj).__qualname__, params, shape_of(list(args))]
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _dependency_hash() -> str:
    """MindSpore's hash of the entry script and its dependencies (compile_cache_manager.cc:
    sha256 of the sorted files' sha256 hex digests, concatenated)."""
    from mindspore.graph import api

    files = sorted(api._get_compile_cache_dep_files())
    hashes = []
    for path in files:
        with open(path, "rb") as f:
            hashes.append(hashlib.sha256(f.read()).hexdigest())
    return hashlib.sha256("".join(hashes).encode()).hexdigest()


PLACEHOLDER = b"autotune.train.runtime.compile_cache: no graph stored for this slot\n"


class GraphCache:
    """The process's cache (see the module doc): ``root`` the store (``graphs/``) and the
    folder MindSpore is pointed at (``slots/<host>-<pid>/``), ``rank`` this process's rank."""

    def __init__(self, root: str, rank: int):
        self.root, self.rank = root, rank
        self.role = "MS_WORKER" if os.environ.get("MS_ROLE") == "MS_WORKER" else ""
        self.slot_root = os.path.join(root, "slots", f"{socket.gethostname()}-{os.getpid()}")
        self.slot_dir = os.path.join(self.slot_root, f"rank_{rank}", "graph_cache")
        self.compiled = 0  # graphs this process compiled: MindSpore's slot index
        self.key = None  # the trial's graph key; None: store and load nothing
        self.update_free_key = None  # the key of its graphs without the update
        self.ordinal = 0  # graphs the trial compiled so far
        self.broken = False
        self.hits = self.stores = 0

    def trial(self, cfg: dict | None) -> None:
        """The next graphs are those of the trial of config ``cfg`` (None: no reuse for this
        trial)."""
        self.key = None if cfg is None else graph_key(cfg)
        self.update_free_key = None if cfg is None else graph_key(cfg, update_free=True)
        self.ordinal, self.hits, self.stores = 0, 0, 0

    def _slot(self, index: int) -> str:
        return os.path.join(self.slot_dir, f"{self.role}compile_cache_{index}.mindir")

    def _clear_slots(self) -> None:
        for name in os.listdir(self.slot_dir):
            if _SLOT.match(name):
                path = os.path.join(self.slot_dir, name)
                shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)

    def hold_next(self) -> None:
        """Empty the slots and put the placeholder where the next graph will look (after the
        cache went off: empty them only, so MindSpore's next compile stops loading)."""
        try:
            self._clear_slots()
            if not self.broken:
                with open(self._slot(self.compiled), "wb") as f:
                    f.write(PLACEHOLDER)
        except OSError as exc:
            self.off(f"{type(exc).__name__}: {exc}")

    def off(self, why: str) -> None:
        """No more storing or loading in this process, said once on stderr; the slots emptied
        where that still works (a file left half copied is no graph MindSpore can load: a miss)."""
        if not self.broken:
            self.broken = True
            print(
                f"{SAY} off for this process: {why}; the trial runs without it",
                file=sys.stderr,
                flush=True,
            )
        try:
            self._clear_slots()
        except OSError:
            pass

    def before(self, obj, args) -> tuple[str | None, dict]:
        """Copy the stored entry of the graph about to compile into its slot. Returns the
        entry's path (None: nothing to store or load) and ``{slot file: its stat}`` of what was
        put there (empty: the placeholder is there)."""
        if self.key is None or self.broken:
            return None, {}
        key = self.update_free_key if getattr(obj, "update_free", False) else self.key
        entry = os.path.join(
            self.root, "graphs", key, f"rank_{self.rank}", f"{self.ordinal}-{_signature(obj, args)}"
        )
        placed = {}
        try:
            if os.path.isdir(entry):
                self._clear_slots()
                for name in os.listdir(entry):
                    slot = os.path.join(self.slot_dir, name.replace("@", str(self.compiled)))
                    copy = (
                        shutil.copytree
                        if os.path.isdir(os.path.join(entry, name))
                        else shutil.copyfile
                    )
                    copy(os.path.join(entry, name), slot)  # a copy: MindSpore may write to it
                    placed[os.path.basename(slot)] = _stat(slot)
        except OSError as exc:  # an entry replaced while copied, a full disk: the cache's own
            self.off(f"loading {entry}: {type(exc).__name__}: {exc}")
            return None, {}
        return entry, placed

    def after(self, entry: str | None, placed: dict) -> None:
        """After a graph compiled: a miss's graph (what MindSpore wrote into the slot) into the
        store, a hit counted; then the placeholder for the next graph."""
        if not self.broken:
            try:
                self._keep(entry, placed)
            except OSError as exc:
                self.off(f"storing {entry}: {type(exc).__name__}: {exc}")
        self.ordinal += 1
        self.compiled += 1
        self.hold_next()

    def _keep(self, entry: str | None, placed: dict) -> None:
        """What :meth:`after` keeps of the graph just compiled: its files stored, or its hit."""
        written = {
            name
            for name in os.listdir(self.slot_dir)
            if _SLOT.match(name)
            and placed.get(name) != _stat(os.path.join(self.slot_dir, name))
            and not _is_placeholder(os.path.join(self.slot_dir, name))
        }
        if any(int(_SLOT.match(n)["index"]) != self.compiled for n in written):
            self.off(f"MindSpore wrote {sorted(written)} for graph {self.compiled}")
        elif entry is not None:
            if placed and not written:
                self.hits += 1
            elif written:
                self._store(entry, written)

    def _store(self, entry: str, names: set) -> None:
        """Move MindSpore's files for this graph into ``entry``, whole or not at all; an entry
        another process stored meanwhile (the same graph: the same files) is kept as it is."""
        if os.path.isdir(entry):
            for name in names:
                path = os.path.join(self.slot_dir, name)
                shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
            return
        with staged_folder(Path(entry)) as staged:
            for name in names:
                match = _SLOT.match(name)
                shutil.move(
                    os.path.join(self.slot_dir, name), staged / f"{match['head']}_@{match['tail']}"
                )
        self.stores += 1


def _stat(path: str):
    info = os.stat(path)
    return info.st_ino, info.st_size, info.st_mtime_ns


def _is_placeholder(path: str) -> bool:
    if os.path.isdir(path) or os.path.getsize(path) != len(PLACEHOLDER):
        return False
    with open(path, "rb") as f:
        return f.read() == PLACEHOLDER


_CACHE: GraphCache | None = None


def install(root: str, rank: int) -> GraphCache | None:
    """Turn MindSpore's compile cache on for this process, through a :class:`GraphCache` under
    ``root`` (see the module doc). Call before the process compiles anything; a second call
    returns the first one's cache. None (one line on stderr) when its folders cannot be made:
    the process runs without it."""
    global _CACHE
    if _CACHE is not None:
        return _CACHE
    from mindspore.graph import api

    cache = GraphCache(root, rank)
    try:
        os.makedirs(cache.slot_dir, exist_ok=True)
        with open(os.path.join(cache.slot_dir, f"{cache.role}compile_dependency.hash"), "w") as f:
            f.write(_dependency_hash())
    except OSError as exc:
        print(
            f"{SAY} off for this process: {type(exc).__name__}: {exc}; the trial runs without it",
            file=sys.stderr,
            flush=True,
        )
        shutil.rmtree(cache.slot_root, ignore_errors=True)
        return None
    atexit.register(shutil.rmtree, cache.slot_root, True)  # the slots are this process's only
    os.environ["MS_COMPILER_CACHE_ENABLE"] = "1"
    os.environ["MS_COMPILER_CACHE_PATH"] = cache.slot_root + os.sep
    cache.hold_next()
    compile_cell, compile_jit = api._CellGraphExecutor.compile, api._JitExecutor.compile

    def cell(self, obj, *args, **kwargs):
        # every call of a compiled cell comes here (each training step): only a cell's first
        # compile looks for an entry; a later one (new input shapes) is counted, never stored
        entry, placed = (None, {}) if obj._compile_cache else cache.before(obj, args)
        try:
            phase, compiled = compile_cell(self, obj, *args, **kwargs)
        except BaseException:
            cache.broken = True  # the count may be off now: no more reuse in this process
            raise
        if compiled:
            cache.after(entry, placed)
        elif placed:  # nothing compiled after all: the placeholder back in its slot
            cache.hold_next()
        return phase, compiled

    def jit(self, *args, **kwargs):
        before = len(api.ms_compile_cache)
        try:
            return compile_jit(self, *args, **kwargs)
        finally:
            if len(api.ms_compile_cache) > before:  # a graph compiled: counted, never stored
                cache.after(None, {})

    api._CellGraphExecutor.compile = cell
    api._JitExecutor.compile = jit
    _CACHE = cache
    return cache
