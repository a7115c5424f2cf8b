"""A study's trials read again and again, each finished trial looked at once.

A study of 10,000 trials is read before every ask (what counts toward N, what waits, what the
other drivers did); a rule that looks at every trial each time costs the study's length per
ask, and the study grows quadratically slower. A finished trial never changes again (Optuna
refuses every write to it), so a reader needs to look at each one once, and again only at the
few that were still waiting or running.

Contract: a :class:`Feed` is handed the study's trials as just read (frozen, in trial-number
order, as ``study.get_trials`` returns them: trial ``i`` at index ``i``) by
:meth:`Feed.update` — or reads them itself, :meth:`Feed.read` — and returns the trials that
finished since the last update (new ones and ones that were unfinished then), in trial order,
each exactly once. :attr:`Feed.unfinished` are the trials unfinished at the last update
(waiting or running), by number. The work per update is the number of new trials plus the
number unfinished, not the study's length: :meth:`Feed.read` takes just those from Optuna's
trial cache (`optuna.storages._CachedStorage`, after its read of what changed in the
database), where ``study.get_trials`` would sort every trial of the study into a new list (10 ms
of a 10,000-trial study, at every ask); on any other storage it reads the study in order.
"""

from __future__ import annotations

from optuna.storages._cached_storage import _CachedStorage


class Feed:
    """Finished trials, each once, from repeated reads of one study (see the module doc)."""

    def __init__(self):
        self.read_upto = 0  # trials 0 … read_upto - 1 were seen
        self.unfinished: dict = {}  # number → the trial (frozen) as last read, not finished then

    def update(self, trials) -> list:
        """The trials of ``trials`` (the study's, in number order) that finished since the last
        update, in trial order; :attr:`unfinished` is brought up to date."""
        return self._update(trials.__getitem__, len(trials))

    def read(self, study) -> list:
        """:meth:`update` with ``study`` read as the module doc says."""
        storage, study_id = study._storage, study._study_id
        if not isinstance(storage, _CachedStorage):
            return self.update(study.get_trials(deepcopy=False))
        storage._read_trials_from_remote_storage(study_id)  # what changed, into the cache
        with storage._lock:
            held = storage._studies[study_id].trials  # number → trial
            return self._update(held.get, len(held))

    def _update(self, trial, count: int) -> list:
        """:meth:`update` of a study of ``count`` trials, trial ``n`` being ``trial(n)`` (None:
        not read yet — another driver's, created since: taken at the next update)."""
        again = [trial(n) for n in sorted(self.unfinished) if n < count]
        new = []
        while self.read_upto < count and trial(self.read_upto) is not None:
            new.append(trial(self.read_upto))
            self.read_upto += 1
        finished = []
        for t in again + new:
            if t.state.is_finished():
                self.unfinished.pop(t.number, None)
                finished.append(t)
            else:
                self.unfinished[t.number] = t
        return finished
