"""A candidate: one point of the search space, a value for every knob (`autotune.spec.knobs`).

Contract: ``Candidate(**values)`` takes one value per knob of :data:`~autotune.spec.knobs.KNOBS`
(by keyword, or positionally in :data:`KNOBS` order; a knob marked ``added_later`` may be left out:
it takes its default) and nothing else; each knob is then an attribute of that name. Candidates are immutable, equal when every knob is, hashable,
and picklable; :meth:`Candidate.as_dict` lists the knobs in :data:`KNOBS` order.
"""

from __future__ import annotations

from autotune.spec.knobs import KNOBS, devices_of, is_active


class Candidate:
    """One point of the search space: a value for every knob."""

    def __init__(self, *positional, **values):
        if len(positional) > len(KNOBS):
            raise TypeError(f"Candidate: {len(positional)} values for {len(KNOBS)} knobs")
        for name, value in zip(KNOBS, positional):
            if name in values:
                raise TypeError(f"Candidate: knob {name} given twice")
            values[name] = value
        unknown = [name for name in values if name not in KNOBS]
        if unknown:
            raise TypeError(f"Candidate: unknown knob(s) {', '.join(unknown)}")
        missing = [
            name for name, knob in KNOBS.items() if name not in values and not knob.added_later
        ]
        if missing:
            raise TypeError(f"Candidate: missing knob(s) {', '.join(missing)}")
        # the values as instance attributes, in KNOBS order: read as fast as a dataclass's
        self.__dict__.update(
            (name, values[name] if name in values else knob.default) for name, knob in KNOBS.items()
        )

    def __setattr__(self, name, value):
        raise AttributeError("Candidate is immutable")

    def __eq__(self, other) -> bool:
        return type(other) is Candidate and self.as_dict() == other.as_dict()

    def __hash__(self) -> int:
        return hash(tuple(self.as_dict().items()))

    def __repr__(self) -> str:
        return f"Candidate({', '.join(f'{k}={v!r}' for k, v in self.as_dict().items())})"

    def __reduce__(self):
        return _rebuild, (self.as_dict(),)

    @property
    def devices(self) -> int:
        """dp·tp·cp·pp (`autotune.spec.knobs.devices_of`)."""
        return devices_of(self.dp, self.tp, self.pp, self.cp)

    def as_dict(self) -> dict:
        return dict(self.__dict__)

    def replace(self, **changes) -> Candidate:
        """The same candidate with ``changes`` (knob → value)."""
        return Candidate(**(self.as_dict() | changes))

    def canonical(self) -> Candidate:
        """The same run with every knob that cannot act on it at its default
        (`autotune.spec.knobs.is_active`): a candidate stored before a knob was known not to
        act (fusion_mb with dp = 1) is the one the space proposes now."""
        return self.replace(
            **{
                name: KNOBS[name].default
                for name in KNOBS
                if not is_active(name, self.dp, self.pp, self.cp)
            }
        )


def _rebuild(values: dict) -> Candidate:
    return Candidate(**values)
