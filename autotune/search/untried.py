"""The candidates of a space a study has not tried, for when its sampler has nothing new.

A sampler may keep proposing what the study has already tried or rejected: TPE over thousands
of trials of a space nearly run through, a sampler drawn into a region the memory screen
rejects. Each such proposal is a trial answered without a run; asked again and again until it
happens on an untried candidate, a study spins, and when no untried candidate is left it
never learns so. The proposer (`autotune.search.proposer`) takes the untried candidates from
here instead, by turns.

Contract:
- :class:`Untried` draws the candidates of a space one at a time in a seeded random order — a
  lazy Fisher-Yates shuffle of every combination of knob values, each resolved as the space
  resolves it (``dp: auto``, a knob that cannot act at its default), so the order is the same
  for the same seed — and :meth:`Untried.next` returns the next one not ``tried`` (ran,
  running, or answered already: the caller's predicate) and not rejected by ``screen`` (the
  caller's predicate: the reason a candidate may not run, "" when it may). Each combination is
  looked at once; a screened-out candidate is kept and screened again once the space is drained
  if the screen may have changed since (its ``version`` differs: the study's calibration moved).
  None: every candidate of the space has been tried or is rejected — the space is exhausted.
  :attr:`Untried.rejected` counts the candidates it screened out that are still rejected.
- :class:`Turns` says whose turn it is: the sampler's, until :data:`STALL` of its proposals in a
  row needed no run (a repeat, a candidate running now, a rejection); then untried candidates,
  1, 2, 4, … up to :data:`MOST` of them between two chances of the sampler, until it proposes
  one that runs again. A stalled sampler costs one trial answered without a run per chance: at
  most one in :data:`MOST` + 1 asks once it has stalled for long, and none while it proposes
  new candidates.
"""

from __future__ import annotations

import math
import random

from autotune.spec.knobs import KNOB_NAMES

STALL = 10  # sampler proposals in a row that needed no run: it has nothing new to offer
MOST = 64  # untried candidates at most between two chances of a stalled sampler


class Untried:
    """The space's candidates not tried yet, in a seeded random order (see the module doc)."""

    def __init__(self, space, seed: int | None):
        self.space = space
        self.domains = [space.domains[name] for name in KNOB_NAMES]
        self.total = math.prod(map(len, self.domains))  # combinations of knob values
        self.rng = random.Random(seed)
        self.drawn = 0
        self.swapped: dict = {}  # the shuffle's moved entries: position → combination index
        self.screened_out: dict = {}  # candidate → the screen's version that rejected it
        self.rejected = 0

    def _draw(self) -> int:
        """The next combination index of the shuffle (Fisher-Yates, entries moved kept sparse)."""
        j = self.rng.randrange(self.drawn, self.total)
        picked = self.swapped.get(j, j)
        self.swapped[j] = self.swapped.pop(self.drawn, self.drawn)
        self.drawn += 1
        return picked

    def _candidate(self, index: int):
        values = {}
        for name, domain in zip(reversed(KNOB_NAMES), reversed(self.domains)):
            index, at = divmod(index, len(domain))
            values[name] = domain[at]
        return self.space._resolve(values)

    def next(self, tried, screen, version=None):
        """The next candidate neither ``tried`` nor rejected by ``screen`` (see the module doc),
        or None when the space is exhausted."""
        while self.drawn < self.total:
            candidate = self._candidate(self._draw())
            if candidate in self.screened_out or tried(candidate):
                continue
            if screen(candidate):
                self.screened_out[candidate] = version
                continue
            return candidate
        for candidate, seen_by in list(self.screened_out.items()):
            if seen_by is version:
                continue
            self.screened_out[candidate] = version
            if not tried(candidate) and not screen(candidate):
                del self.screened_out[candidate]
                return candidate
        self.rejected = sum(not tried(c) for c in self.screened_out)
        return None


class Turns:
    """Whose turn it is to propose: the sampler's or the untried candidates' (see the module
    doc)."""

    def __init__(self):
        self.misses = 0  # the sampler's proposals in a row that needed no run
        self.owed = 0  # untried candidates to propose before the sampler's next chance
        self.backoff = 1

    def untried_due(self) -> bool:
        return self.owed > 0

    def took_untried(self) -> None:
        self.owed -= 1

    def sampler_proposed(self, runs: bool) -> None:
        """The sampler proposed a candidate that ``runs`` (or needed no run)."""
        if runs:
            self.misses, self.backoff = 0, 1
            return
        self.misses += 1
        if self.misses >= STALL:
            self.owed, self.backoff = self.backoff, min(2 * self.backoff, MOST)
