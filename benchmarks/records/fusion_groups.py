# measured at eb342d4
# A MindSpore fact check (docs/parallel.md, docs/mindspore-cpu.md): re-run it after a MindSpore
# upgrade.
"""How many gradient all-reduces a step issues, per fusion threshold, over the world group (pure
data parallelism) and over dp sub-groups (dp with tensor or pipeline parallelism).

The trial program reduces gradients with MindSpore's own ``nn.DistributedGradReducer`` on every
layout — over the world group under pure DP, over the rank's dp group otherwise — and MindSpore's
``comm_fusion`` "size" pass buckets them. This runs the real trial program (2 steps) with
MindSpore's graph dumps on and counts, in rank 0's compiled graphs, the all-reduces the reducer
left after fusion (the ones with a fusion id; tensor-parallel all-reduces have none), beside the
rank's gradient bytes: the same threshold gives buckets of the same size on either kind of group.

    python benchmarks/records/fusion_groups.py [MODEL_YAML] [--thresholds 1 4 64]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from autotune.execution.runner import run_trial  # noqa: E402
from autotune.layout import builtin_layout, rank_elements  # noqa: E402
from autotune.spec.candidate import Candidate  # noqa: E402
from autotune.spec.model_yaml import load_spec  # noqa: E402
from autotune.train.config import trial_config  # noqa: E402

LAYOUTS = [(2, 1, 1), (2, 2, 1), (2, 1, 2)]
_REDUCER_NODE = re.compile(r"= AllReduce\(.*?group: \"([^\"]+)\", fusion: I64\((\d+)\)")


def count_reducer_allreduces(ir_dir: Path) -> tuple[int, set]:
    """All-reduces with a fusion id in rank 0's compiled graphs, and their groups."""
    count, groups = 0, set()
    for ir in (ir_dir / "rank_0").glob("graph_build_*.ir"):
        for group, fusion in _REDUCER_NODE.findall(ir.read_text(errors="replace")):
            if int(fusion) > 0:
                count += 1
                groups.add(group)
    return count, groups


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_yaml", nargs="?", default=str(ROOT / "examples" / "tiny_gpt.yaml"))
    parser.add_argument("--thresholds", type=int, nargs="+", default=[1, 4, 64])
    args = parser.parse_args()
    table = Table(title="gradient all-reduces per step after MindSpore's comm_fusion (rank 0)")
    for column in (
        "layout",
        "reducer group",
        "grad MB (rank 0)",
        *(f"fusion {t} MB: all-reduces (MB each)" for t in args.thresholds),
    ):
        table.add_column(column, justify="right")
    work = Path(tempfile.mkdtemp(prefix="autotune-fusion-"))
    try:
        for dp, tp, pp in LAYOUTS:
            devices = dp * tp * pp
            spec = load_spec(
                args.model_yaml, {"cluster.devices": devices, "cluster.devices_per_node": devices}
            )
            layouts, _ = builtin_layout(spec.model.as_config(), tp, pp)
            grad_mb = rank_elements(layouts, tp, 0) * 4 / 2**20
            cells, groups = [], set()
            for threshold in args.thresholds:
                c = Candidate(
                    dp=dp,
                    tp=tp,
                    pp=pp,
                    micro_batches=2 if pp > 1 else 1,
                    fusion_mb=threshold,
                    grad_accum=1,
                    loss_scale=1024,
                    warmup_steps=0,
                    jit_level="O1",
                    recompute="none",
                )
                folder = work / f"{dp}{tp}{pp}-{threshold}"
                config = trial_config(
                    spec, c, study="fusion", number=0, out_dir=folder, steps=2, measure_after=1
                )
                os.environ.update(
                    MS_DEV_SAVE_GRAPHS="1", MS_DEV_SAVE_GRAPHS_PATH=str(folder / "ir")
                )
                result = run_trial(config, folder, 600, None, c.devices)
                if result.outcome != "ok":
                    print(
                        f"dp{dp} tp{tp} pp{pp} fusion {threshold}: {result.outcome}: "
                        f"{result.detail.splitlines()[0] if result.detail else ''}",
                        file=sys.stderr,
                    )
                    cells.append(result.outcome)
                    continue
                count, found = count_reducer_allreduces(folder / "ir")
                groups |= found
                cells.append(f"{count} ({grad_mb / max(count, 1):.2f})")
                shutil.rmtree(folder / "ir", ignore_errors=True)  # dumps are large
            table.add_row(
                f"dp{dp} tp{tp} pp{pp}", ", ".join(sorted(groups)), f"{grad_mb:.2f}", *cells
            )
    finally:
        os.environ.pop("MS_DEV_SAVE_GRAPHS", None)
        shutil.rmtree(work, ignore_errors=True)
    Console(width=160).print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
