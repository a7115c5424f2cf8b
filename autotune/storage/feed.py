"""A study's trials read again and again, each finished trial looked at once.

A study of 10,000 trials is read before every ask (what counts toward N, what waits, what the
other drivers did); a rule that looks at every trial each time costs the study's length per
ask, and the study grows quadratically slower. A finished trial never changes again (Optuna
refuses every write to it), so a reader needs to look at each one once, and again only at the
few that were still waiting or running.

Contract: a :class:`Feed` is handed the study's trials as just read (frozen, in trial-number
order, as ``study.get_trials`` returns them: trial ``i`` at index ``i``) by
:meth:`Feed.update`, which returns the trials that finished since the last update (new ones
and ones that were unfinished then), in trial order, each exactly once. :attr:`Feed.unfinished`
are the trials unfinished at the last update (waiting or running), by number. The work per
update is the number of new trials plus the number unfinished, not the study's length.
"""

from __future__ import annotations


class Feed:
    """Finished trials, each once, from repeated reads of one study (see the module doc)."""

    def __init__(self):
        self.read = 0  # trials 0 … read - 1 were seen
        self.unfinished: dict = {}  # number → the trial (frozen) as last read, not finished then

    def update(self, trials) -> list:
        """The trials of ``trials`` (the study's, in number order) that finished since the last
        update, in trial order; :attr:`unfinished` is brought up to date."""
        again = [trials[n] for n in sorted(self.unfinished) if n < len(trials)]
        new = trials[self.read :]
        self.read = max(self.read, len(trials))
        finished = []
        for t in again + list(new):
            if t.state.is_finished():
                self.unfinished.pop(t.number, None)
                finished.append(t)
            else:
                self.unfinished[t.number] = t
        return finished
