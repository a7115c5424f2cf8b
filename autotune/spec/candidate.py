"""A candidate: one point of the search space, a value for every knob (`autotune.spec.knobs`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from autotune.spec.knobs import KNOBS, is_active


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

    def canonical(self) -> Candidate:
        """The same run with every knob that cannot act on it at its default
        (`autotune.spec.knobs.is_active`): a candidate stored before a knob was known not to
        act (fusion_mb with dp = 1) is the one the space proposes now."""
        return replace(self, **{name: KNOBS[name].default for name in KNOBS
                                if not is_active(name, self.dp, self.pp)})
