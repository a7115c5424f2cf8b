# measured at b33cffb
# A MindSpore fact check (docs/mindspore-cpu.md, "Compile cache"): re-run it after a MindSpore
# upgrade.
"""Which knobs a cached graph holds: whether the graphs of trials that differ in the fusion
threshold or the parallel optimizer are the same graphs (docs/mindspore-cpu.md, "Compile cache"),
what lets such trials share them (`autotune.train.runtime.compile_cache`, `Knob.graphs`).

The tiny GPT's dp2 trial with gradient accumulation 2 compiles two graphs: the accumulate
graph (forward + backward, `autotune.train.step.train_step.AccumulateStep`) and the update
(`ApplyStep`: the DP all-reduce, the optimizer). Each candidate below runs as a fresh trial with a
compile cache of its own (so nothing loads), and each graph MindSpore stored is read back as
MindSpore's own MindIR protobuf (``mindspore.train.mind_ir_pb2``) and compared with the
reference trial's, in a canonical form: node and value names (which count the nodes the
process has made, and order a closure's free variables as they come) renamed in order of first
use, the digits of string attributes and operator references (unique ids, counters) replaced by
``#``, and the primitive table (stored in hash order) sorted with its names' digits out. Shapes,
numbers and every other attribute are compared as they are. The reference run again is the control for what varies between two identical runs;
recompute full is the control for a graph that does change. A last run, fusion 1 from the
reference's cache, loads the reference's graphs. Every run dumps the graphs MindSpore's backend
builds (``MS_DEV_SAVE_GRAPHS``, pass ``graph_build``): the AllReduce nodes of rank 0's update
there are the buckets the fusion threshold made.

Prints, per run, whether each graph is the reference's, the AllReduce nodes and the graphs loaded.

    python benchmarks/records/shared_graphs.py     # ~3 min
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from autotune.execution.runner import run_trial  # noqa: E402
from autotune.spec.model_yaml import load_spec  # noqa: E402
from autotune.spec.space import build_space  # noqa: E402
from autotune.train.config import trial_config  # noqa: E402

GRAPHS = ("accumulate", "update")  # the order the trial compiles them: its ordinals 0 and 1
_NODE = re.compile(r'^(\s*(?:input|output|name): ")([^"]*:[^"]*)"$')  # a node's or value's name
_COUNTED = re.compile(r'^(\s*(?:s|op_type): ")([^"]*)"$')


def canonical(path: Path) -> tuple:
    """A stored MindIR graph as text, less what counts the process's nodes (see the module doc)."""
    from mindspore.train import mind_ir_pb2

    model = mind_ir_pb2.ModelProto()
    model.ParseFromString(path.read_bytes())
    names = {}

    def text(message) -> str:
        lines = []
        for line in str(message).splitlines():
            node = _NODE.match(line)
            counted = _COUNTED.match(line)
            if node:  # renamed in order of first use: only the graph's wiring is compared
                line = f'{node[1]}v{names.setdefault(node[2], len(names))}"'
            elif counted:
                line = counted[1] + re.sub(r"\d+", "#", counted[2]) + '"'
            lines.append(line)
        return "\n".join(lines)

    def primitive(message) -> str:
        return re.sub(r'"[^"]*"', lambda m: re.sub(r"\d+", "#", m[0]), str(message))

    return text(model.graph), text(model.functions), sorted(primitive(p) for p in model.primitives)


def stored_graphs(cache: Path) -> dict:
    """``{graph: canonical form}`` of rank 0's stored graphs, by the trial's compile order."""
    found = {}
    for entry in (cache / "graphs").glob("*/rank_0/*"):
        ordinal = int(entry.name.split("-")[0])
        (mindir,) = entry.glob("*.mindir")
        found[GRAPHS[ordinal]] = canonical(mindir)
    return found


def allreduces(ir_dir: Path) -> int:
    """AllReduce nodes in rank 0's update graph as MindSpore's backend built it."""
    return max(
        len(re.findall(r"AllReduce\(", p.read_text()))
        for p in (ir_dir / "rank_0").glob("graph_build_*.ir")
    )


def main() -> None:
    spec = load_spec(ROOT / "examples" / "tiny_gpt.yaml")
    reference = build_space(spec).baseline().replace(grad_accum=2)  # dp2, fusion 64
    runs = {
        "reference (fusion 64)": (reference, 0),
        "reference again": (reference, 1),
        "fusion 1": (reference.replace(fusion_mb=1), 2),
        "parallel optimizer": (reference.replace(parallel_optimizer=True), 3),
        "recompute full": (reference.replace(recompute="full"), 4),
        "fusion 1, reference's cache": (reference.replace(fusion_mb=1), 0),
    }
    work = Path(tempfile.mkdtemp(prefix="autotune-shared-graphs-"))
    rows = {}
    os.environ.update(MS_DEV_SAVE_GRAPHS="1", MS_DEV_DUMP_IR_PASSES="graph_build")
    try:
        for i, (name, (candidate, cache_of)) in enumerate(runs.items()):
            folder, cache, ir = work / f"trial-{i}", work / f"cache-{cache_of}", work / f"ir-{i}"
            stored_before = stored_graphs(cache) if cache.exists() else {}
            os.environ["MS_DEV_SAVE_GRAPHS_PATH"] = str(ir)
            config = trial_config(
                spec,
                candidate,
                study="shared-graphs",
                number=i,
                out_dir=folder.resolve(),
                steps=8,
                measure_after=2,
                compile_cache=cache,
            )
            result = run_trial(config, folder, 600, None, candidate.devices)
            if result.outcome != "ok":
                raise SystemExit(f"{name}: {result.outcome}: {result.detail[:2000]}")
            log = (folder / "logs" / "worker_0.log").read_text()
            loaded = re.search(r"compile cache: graph \w+: (\d+ of \d+) graphs loaded", log)[1]
            rows[name] = (
                stored_before or stored_graphs(cache),
                allreduces(ir),
                loaded,
                result.metrics["loss_last"],
            )
            print(f"  {name}: ran, {loaded} graphs loaded", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    first = rows[next(iter(runs))][0]
    print(
        "\nthe tiny GPT's dp2 trial with accumulation 2 (8 steps), each graph against the "
        "reference's (canonical MindIR: node counters out)\n"
    )
    print(
        f"{'run':>28} | accumulate graph | update graph | AllReduce nodes | graphs loaded | last loss"
    )
    print("-" * 104)
    for name, (stored, nodes, loaded, loss) in rows.items():
        same = ["same" if stored[g] == first[g] else "differs" for g in GRAPHS]
        print(
            f"{name:>28} | {same[0]:>16} | {same[1]:>12} | {nodes:>15} | {loaded:>13} | {loss:.6f}"
        )


if __name__ == "__main__":
    main()
