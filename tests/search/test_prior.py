"""The prior of sampler ``auto`` trusts measurements over its cost model: it explores layouts
before it polishes one, learns mechanism by mechanism, risks a candidate predicted just over
the memory cap once memory measurements say the model is pessimistic, and a resumed study
proposes what an uninterrupted one would. Replay tables built here from the cost model, made
wrong on purpose; real studies into real Optuna storage."""

import csv
import textwrap

import numpy as np
import optuna
import pytest

from autotune.cli import main
from autotune.spec.knobs import KNOB_NAMES
from autotune.storage import counting, schema
from tests.conftest import SIM8_MODEL

SPACE = (
    "study: prior\n"
    + SIM8_MODEL
    + """\
cluster: {backend: replay, replay: table.csv, devices: 8, devices_per_node: 8,
          device: DEVICE}
search:
  space: {tp: [1, 2, 4], pp: [1, 2], micro_batches: [2, 4], fusion_mb: [16, 64, 256],
          grad_accum: [1, 2, 4], loss_scale: 65536, warmup_steps: 0, jit_level: O1,
          recompute: [none, selective, full], parallel_optimizer: [false, true]}
  objectives: [goodput]
  seed: 0
"""
)


def spec_file(tmp_path, device="a100-80g", extra=""):
    path = tmp_path / "model.yaml"
    path.write_text(textwrap.dedent(SPACE).replace("DEVICE", device) + extra)
    return path


def table(path, time_factor=None, memory_factor=1.0, limit_gb=None) -> dict:
    """A replay table of the space of ``path``: the cost model's step time with each candidate's
    parts scaled by ``time_factor(candidate, part)``, its peak × ``memory_factor``; a candidate
    whose true peak is over ``limit_gb`` ran out of memory. Returns candidate → goodput (None:
    out of memory)."""
    from autotune.costmodel import estimate
    from autotune.spec.model_yaml import load_spec
    from autotune.spec.space import build_space

    spec = load_spec(path)
    truth = {}
    with open(path.parent / "table.csv", "w", newline="") as f:
        out = csv.writer(f)
        out.writerow([*KNOB_NAMES, "goodput", "step_time_ms", "peak_memory_mb", "outcome"])
        for c in build_space(spec).candidates():
            est = estimate(spec, c)
            if not est.breakdown:
                continue
            seconds = sum(
                v * (time_factor(c, k) if time_factor else 1.0)
                for k, v in est.breakdown["time_s"].items()
            )
            memory = est.memory_gb_per_device * memory_factor
            fits = limit_gb is None or memory <= limit_gb
            truth[c] = 64 / seconds if fits else None
            out.writerow(
                [
                    *c.as_dict().values(),
                    truth[c] or "",
                    seconds * 1000,
                    memory * 1024,
                    "ok" if fits else "oom",
                ]
            )
    return truth


def layout(c):
    return c.dp, c.tp, c.pp, c.micro_batches if c.pp > 1 else c.grad_accum


def ran(storage, name="prior"):
    study = optuna.load_study(study_name=name, storage=storage)
    return [t for t in study.trials if counting.counted(t) and schema.outcome_of(t) != "infeasible"]


def candidate_of(t):
    from autotune.spec.candidate import Candidate

    return Candidate(**schema.knobs_of(t))


def test_an_unmeasured_layout_that_could_be_better_runs_before_a_third_variant(tmp_path):
    """The model prices tp's all-reduces 1.6× too cheap, so the tp layouts it ranks first are
    slower than it thinks. Every layout whose optimistic value beats the best measurement runs
    before any measured layout gets a third trial, and the study finds the truth's best."""
    path = spec_file(tmp_path)
    truth = table(path, lambda c, part: 1.6 if part == "tp_comm" else 1.0)
    storage = f"sqlite:///{tmp_path}/s.db"
    assert main(["search", str(path), "--storage", storage, "--trials", "10"]) == 0
    trials = ran(storage)
    runs: dict = {}
    for t in trials:
        if not ("exploring" in t.user_attrs or t.user_attrs.get("baseline")):
            prior, layouts = _prior_before(path, trials, t.number)
            # polishing: no layout is left that has not run and could beat the best measured
            assert all("not measured yet" not in entry.get("why", "") for entry in layouts)
            if runs.get(layout(candidate_of(t)), 0) >= 2:  # nor one that could beat this one
                _, optimistic = prior._values()
                mine = float(optimistic[prior.index[prior.project(candidate_of(t))]])
                assert all(
                    entry["reach"] <= np.exp(mine) * (1 + 1e-9)
                    for entry in layouts
                    if not entry["ran"] and entry["reach"] is not None
                )
        runs[layout(candidate_of(t))] = runs.get(layout(candidate_of(t)), 0) + 1
    assert max(runs.values()) >= 3  # it did polish, once the layouts were measured
    best = max(t.values[0] for t in trials if t.values)
    assert best == pytest.approx(max(g for g in truth.values() if g))


def _prior_before(path, trials, number):
    """(the prior, its layout report) as they stood before trial ``number`` was proposed."""
    from autotune.search.prior import Prior
    from autotune.spec.model_yaml import load_spec
    from autotune.spec.space import build_space

    spec = load_spec(path)
    prior = Prior(spec, build_space(spec), 0)
    measured = []
    for t in trials:
        if t.number >= number:
            break
        prior.mark(candidate_of(t), schema.outcome_of(t))
        if t.values:
            measured.append(
                (candidate_of(t), t.user_attrs["peak_memory_mb"], t.user_attrs["step_time_ms"])
            )
    return prior, prior.layouts(measured)


def test_measuring_a_mechanism_shrinks_its_uncertainty_and_not_the_others(tmp_path):
    from autotune.search.belief import SIGMA_MECHANISM
    from autotune.search.prior import Prior
    from autotune.spec.model_yaml import load_spec
    from autotune.spec.space import build_space

    path = spec_file(tmp_path)
    truth = table(path)
    spec = load_spec(path)
    prior = Prior(spec, build_space(spec), 0)
    baseline = build_space(spec).baseline()
    pipelined = [c for c in truth if c.pp == 2 and c.tp == 1 and truth[c]][:3]
    measured = [(c, 1000.0, 64 / truth[c] * 1000) for c in [baseline, *pipelined]]
    for c in [baseline, *pipelined]:
        prior.mark(c, "ok")
    prior.next(measured)
    sd = prior.belief.mechanism_sd()
    # the pipeline was measured (its stage compute, bubble and transfers): known better
    assert sd["pipeline"] < 0.7 * SIGMA_MECHANISM
    # tp never ran (tp = 1 everywhere): what tp's all-reduces cost is as uncertain as before
    assert sd["tp"] == pytest.approx(SIGMA_MECHANISM)
    # so a tp layout's value is less certain than another pipelined variant's
    _, layout_var = prior.belief.predict()
    tp4 = [prior.index[c] for c in prior.candidates if c.tp == 4 and c.pp == 1]
    pp2 = [prior.index[c] for c in prior.candidates if layout(c) == layout(pipelined[0])]
    assert np.median(layout_var[tp4]) > 4 * np.median(layout_var[pp2])
    # measuring tp shrinks tp's uncertainty in turn — as far as tp's share of those steps
    # (≈10 %) lets the measurements tell it apart — and what a tp layout may cost, much more
    tp_runs = [c for c in truth if c.tp == 4 and c.pp == 1 and truth[c]][:2]
    for c in tp_runs:
        prior.mark(c, "ok")
    prior.next(measured + [(c, 1000.0, 64 / truth[c] * 1000) for c in tp_runs])
    assert prior.belief.mechanism_sd()["tp"] < 0.95 * SIGMA_MECHANISM
    _, after = prior.belief.predict()
    assert np.median(after[tp4]) < 0.6 * np.median(layout_var[tp4])


def test_a_candidate_just_over_the_cap_runs_once_memory_measured_says_the_model_is_pessimistic(
    tmp_path, capsys
):
    """True peaks are 0.6× the estimates; on a 12 GB device the fastest candidates (dp8 without
    accumulation) are estimated just over the cap, the baseline (accumulation 4) well under it.
    The memory the baseline measured makes them likely to fit: the prior proposes one (the
    memory screen does not refuse it) and it runs."""
    from autotune.costmodel import SAFETY_MARGIN, estimate
    from autotune.spec.model_yaml import load_spec

    path = spec_file(tmp_path, "{base: a100-80g, memory_gb: 12}", "baseline: {grad_accum: 4}\n")
    truth = table(path, memory_factor=0.6, limit_gb=12 * SAFETY_MARGIN)
    spec = load_spec(path)
    over = {c for c in truth if estimate(spec, c).memory_gb_per_device > 12 * SAFETY_MARGIN}
    assert max(truth[c] or 0 for c in over) > max(truth[c] or 0 for c in truth if c not in over)
    storage = f"sqlite:///{tmp_path}/s.db"
    assert main(["search", str(path), "--storage", storage, "--trials", "6"]) == 0
    trials = ran(storage)
    assert candidate_of(trials[0]) not in over  # the baseline fits by the estimate
    risked = [t for t in trials if candidate_of(t) in over]
    assert risked and all(t.user_attrs["proposed_by"] == "prior" for t in risked)
    assert any(schema.outcome_of(t) == "ok" for t in risked)


def test_a_resumed_study_proposes_what_an_uninterrupted_one_would(tmp_path):
    path = spec_file(tmp_path)
    table(path, lambda c, part: {"tp_comm": 1.6, "dp_comm": 0.6}.get(part, 1.0))
    whole, halves = f"sqlite:///{tmp_path}/whole.db", f"sqlite:///{tmp_path}/halves.db"
    assert main(["search", str(path), "--storage", whole, "--trials", "9"]) == 0
    assert main(["search", str(path), "--storage", halves, "--trials", "4"]) == 0
    assert main(["search", str(path), "--storage", halves, "--trials", "9", "--resume"]) == 0
    assert [candidate_of(t) for t in ran(whole)] == [candidate_of(t) for t in ran(halves)]
