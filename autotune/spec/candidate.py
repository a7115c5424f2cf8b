"""A candidate: one point of the search space, a value for every knob (`autotune.spec.knobs`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Candidate:
    """One point of the search space: a value for every knob."""

    dp: int
    tp: int
    pp: int
    micro_batches: int
    fusion_mb: int
    grad_accum: int
    loss_scale: int
    warmup_steps: int
    jit_level: str
    recompute: str
    parallel_optimizer: bool = False

    @property
    def devices(self) -> int:
        return self.dp * self.tp * self.pp

    def as_dict(self) -> dict:
        return asdict(self)
