"""How a searched knob becomes an Optuna param, and back.

Contract: :func:`param_for` gives the :class:`Param` through which a study samples one knob.

- ``ordered`` (every study created since ordered knobs): a numeric knob is an integer
  distribution, so a sampler sees that 1 < 2 < 4 < 8 — powers of two whose exponents are evenly
  spaced as the exponent (param ``log2_<knob>``), other evenly spaced values as themselves
  (param ``<knob>``), anything else as the index into the sorted values (param
  ``<knob>_index``). ``jit_level`` and ``recompute`` stay categorical (param ``<knob>``).
- ``categorical`` (studies created before): every knob a categorical param named after it,
  its choices in the domain's order — exactly what those studies stored, so they resume.

Whatever the param, a trial keeps each knob's value readable under the knob's own name: as the
param when the param is named after the knob and holds the value, else as a user attr
(`autotune.spec.space.SearchSpace.sample` says which).
"""

from __future__ import annotations

from dataclasses import dataclass

from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution

ORDERED, CATEGORICAL = "ordered", "categorical"
ENCODINGS = (ORDERED, CATEGORICAL)


@dataclass(frozen=True)
class Param:
    """One knob's param: its name in the study, distribution, and the knob values it covers
    (sorted for an ordered param). ``form``: ``value`` (the param is the value), ``log2`` (its
    exponent), ``index`` (its position in ``values``) or ``choice`` (categorical)."""

    knob: str
    name: str
    distribution: BaseDistribution
    values: tuple
    form: str

    @property
    def holds_value(self) -> bool:
        """Whether the param is named after the knob and holds its value."""
        return self.name == self.knob and self.form in ("value", "choice")

    def encode(self, value):
        """The param value of a knob value."""
        if self.form == "log2":
            return value.bit_length() - 1
        if self.form == "index":
            return self.values.index(value)
        return value

    def decode(self, raw):
        """The knob value of a param value."""
        if self.form == "log2":
            return 2 ** int(raw)
        if self.form == "index":
            return self.values[int(raw)]
        return int(raw) if self.form == "value" else raw

    def suggest(self, trial):
        """Sample the knob through ``trial``; returns the knob's value."""
        d = self.distribution
        if isinstance(d, CategoricalDistribution):
            return trial.suggest_categorical(self.name, list(d.choices))
        return self.decode(trial.suggest_int(self.name, d.low, d.high, step=d.step))


def _even_step(numbers: list[int]) -> int | None:
    """The common difference of ``numbers`` (ascending, two or more), or None."""
    steps = {b - a for a, b in zip(numbers, numbers[1:])}
    return steps.pop() if len(steps) == 1 else None


def param_for(knob: str, domain: tuple, encoding: str) -> Param:
    """The param a study of ``encoding`` samples ``knob`` over ``domain`` (two or more values)
    with (see the module doc)."""
    numeric = all(isinstance(v, int) and not isinstance(v, bool) for v in domain)
    if encoding == CATEGORICAL or not numeric:
        return Param(knob, knob, CategoricalDistribution(list(domain)), tuple(domain), "choice")
    values = tuple(sorted(domain))
    if all(v > 0 and not v & (v - 1) for v in values):
        exponents = [v.bit_length() - 1 for v in values]
        step = _even_step(exponents)
        if step is not None:
            return Param(
                knob,
                f"log2_{knob}",
                IntDistribution(exponents[0], exponents[-1], step=step),
                values,
                "log2",
            )
    step = _even_step(list(values))
    if step is not None:
        return Param(knob, knob, IntDistribution(values[0], values[-1], step=step), values, "value")
    return Param(knob, f"{knob}_index", IntDistribution(0, len(values) - 1), values, "index")
