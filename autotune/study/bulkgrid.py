"""A whole grid through an instant executor (simulate, replay), stored in bulk.

Contract: :func:`run_bulk_grid` settles every candidate left in the proposer's grid — the
feasibility verdict, then the executor's answer — and stores them with ``add_trials`` in batches:
a grid needs no sampler, so each trial is one storage write instead of an ask, attrs and a tell.
The recorder's calibration is refit from the measurements and stored after each batch; the
progress display hears each batch (how many ran: a rejected candidate is no run), and at the
end one line that the space is exhausted. A study's run (`autotune.study.run`) calls it for a grid on an
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
    # the candidates earlier sessions tried, and how many of them ran
    ran = sum(outcome != "infeasible" for _, outcome, *_ in proposer.seen.values())
    tried = len(proposer.seen)
    while proposer.grid:
        chunk = [proposer.grid.popleft() for _ in range(min(batch, len(proposer.grid)))]
        trials, ok_values, runs = [], [], 0
        for candidate, params in chunk:
            estimate, reason = proposer.verdict(candidate)
            extra = {"estimate": estimate.as_dict(), **space.attrs_of(candidate)}
            if candidate == baseline:  # first (`Proposer.start_grid`): the ratio's denominator
                extra["baseline"] = True
            if reason:
                result = Result("infeasible", detail=reason)
            else:
                result = executor.evaluate(candidate, estimate)
                runs += result.outcome != "infeasible"
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
        progress.batch_done(len(trials), runs, ok_values)
        ran, tried = ran + runs, tried + len(trials)
    progress.note(
        "the space is exhausted: every candidate has run or is infeasible "
        f"({ran} ran, {tried - ran} infeasible)"
    )
