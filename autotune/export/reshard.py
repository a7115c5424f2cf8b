"""Reshard a user's full (single-device) checkpoint into the tuned layout.

Contract:
- :func:`plan_reshard` reads the checkpoint once and raises :class:`SpecError` unless it holds
  every model parameter with its full shape. Tensors named ``<prefix>.<parameter>`` with that
  parameter's shape (optimizer moments such as ``adam_m.<name>``) are split like the parameter;
  everything else (step counters, the loss scale, …) is copied whole to every rank, which is what
  ``transform_checkpoints`` does with names its strategy lacks.
- :func:`reshard` runs ``mindspore.parallel.transform_checkpoints`` and leaves
  ``<dest>/rank_<r>/checkpoint_<r>.ckpt`` for every rank r (rank order: ``layout.rank_coords``).
  ``transform_checkpoints`` wants the source as ``<dir>/rank_0/<file>.ckpt``, so the file is
  linked into a scratch folder of that shape rather than copied.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from autotune.export.strategy import STRATEGY_FILE, check_coverage, write_strategies
from autotune.spec.errors import SpecError

CKPT_PREFIX = "checkpoint_"


@dataclass(frozen=True)
class ReshardPlan:
    source: Path
    layouts: dict  # name → ParamLayout for every tensor that is split or placed on a stage
    copied_whole: tuple[str, ...]

    def describe(self) -> dict:
        return {
            "source": str(self.source),
            "tensors_laid_out": len(self.layouts),
            "copied_whole": list(self.copied_whole),
        }


def _owner(name: str, layouts: dict) -> str | None:
    """The parameter an optimizer-state name ``<prefix>.<parameter>`` belongs to, if any."""
    for i, char in enumerate(name):
        if char == "." and name[i + 1 :] in layouts:
            return name[i + 1 :]
    return None


def plan_reshard(source: str | os.PathLike, layouts: dict) -> ReshardPlan:
    import mindspore as ms

    source = Path(source).resolve()
    if not source.is_file() or source.suffix != ".ckpt":
        raise SpecError(f"--reshard {source}: not a MindSpore .ckpt file")
    try:
        tensors = ms.load_checkpoint(str(source))
    except Exception as exc:  # corrupt or foreign file: the user's input
        raise SpecError(f"--reshard {source}: cannot load: {type(exc).__name__}: {exc}") from None
    shapes = {name: tuple(value.shape) for name, value in tensors.items()}
    missing = [n for n in layouts if n not in shapes]
    wrong = [
        f"{n} {shapes[n]} (model: {p.shape})"
        for n, p in layouts.items()
        if n in shapes and shapes[n] != p.shape
    ]
    if missing or wrong:
        problems = (
            [f"missing {', '.join(missing[:5])}" + (" …" if len(missing) > 5 else "")]
            if missing
            else []
        ) + [f"shape of {w}" for w in wrong[:5]]
        raise SpecError(f"--reshard {source}: does not match the model: {'; '.join(problems)}")
    planned, whole = dict(layouts), []
    for name, shape in shapes.items():
        if name in layouts:
            continue
        owner = _owner(name, layouts)
        if owner is not None and shape == layouts[owner].shape:
            planned[name] = replace(layouts[owner], name=name)
        else:
            whole.append(name)
    return ReshardPlan(source, planned, tuple(whole))


def reshard(plan: ReshardPlan, dp: int, tp: int, pp: int, dest: Path) -> None:
    from mindspore.parallel import transform_checkpoints

    with tempfile.TemporaryDirectory(prefix="autotune-reshard-") as scratch:
        scratch = Path(scratch)
        (scratch / "src" / "rank_0").mkdir(parents=True)
        (scratch / "src" / "rank_0" / "full.ckpt").symlink_to(plan.source)
        # The strategy used here also lays out optimizer states, which strategy.ckpt leaves out.
        (scratch / "strategy").mkdir()
        write_strategies(plan.layouts, dp, tp, pp, scratch / "strategy")
        strategy = scratch / "strategy" / STRATEGY_FILE
        check_coverage(strategy, plan.layouts, pp)
        transform_checkpoints(str(scratch / "src"), str(dest), CKPT_PREFIX, None, str(strategy))
    made = sorted(p.name for p in dest.glob("rank_*"))
    if len(made) != dp * tp * pp:
        raise RuntimeError(
            f"transform_checkpoints wrote {len(made)} rank folders, expected {dp * tp * pp}"
        )
