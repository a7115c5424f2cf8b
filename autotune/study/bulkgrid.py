"""A whole grid through an instant executor (simulate, replay), stored in bulk.

Contract: :func:`run_bulk_grid` settles every candidate left in the proposer's grid — the
feasibility verdict, then the executor's answer — and stores them with ``add_trials`` in batches:
a grid needs no sampler, so each trial is one storage write instead of an ask, attrs and a tell.
The recorder's calibration is refit from the measurements and stored after each batch; the
progress display hears each batch. A study's run (`autotune.study.run`) calls it for a grid on an
instant executor with no budget and one driver.
"""

from __future__ import annotations

import optuna

from autotune.jobs import Result
from autotune.storage.schema import settle


def run_bulk_grid(study, proposer, executor, recorder, progress, batch: int = 250) -> None:
    """Settle and store every candidate left in ``proposer.grid`` (see the module doc)."""
    space = proposer.space
    distributions = space.distributions()
    number, baseline = len(study.get_trials(deepcopy=False)), space.baseline()
    while proposer.grid:
        chunk = [proposer.grid.popleft() for _ in range(min(batch, len(proposer.grid)))]
        trials, ok_values = [], []
        for candidate, params in chunk:
            estimate, reason = proposer.verdict(candidate)
            extra = {"estimate": estimate.as_dict(), **space.attrs_of(candidate)}
            if candidate == baseline:  # first (`Proposer.start_grid`): the ratio's denominator
                extra["baseline"] = True
            if reason:
                result = Result("infeasible", detail=reason)
            else:
                result = executor.evaluate(candidate, estimate)
                extra.update(result.timing())
                if result.outcome == "ok":
                    recorder.add_measurement(candidate, estimate, result.metrics)
                    proposer.calibration = recorder.calibration
            state, values, attrs = settle(
                recorder.objectives, result.outcome, result.metrics, result.detail, extra
            )
            if values:
                ok_values.append((values[0], number + len(trials)))
            trials.append(
                optuna.trial.create_trial(
                    state=state,
                    values=values,
                    params=params,
                    user_attrs=attrs,
                    distributions={k: distributions[k] for k in params},
                )
            )
        study.add_trials(trials)
        if recorder.calibration is not None:
            recorder.store_calibration()
        number += len(trials)
        progress.batch_done(len(trials), ok_values)
