"""The prior of sampler ``auto`` trusts measurements over its cost model: it explores layouts
before it polishes one, learns mechanism by mechanism, risks a candidate predicted just over
the memory cap once memory measurements say the model is pessimistic, and a resumed study
proposes what an uninterrupted one would. Replay tables built here from the cost model, made
wrong on purpose; real studies into real Optuna storage."""

import csv
import textwrap
from pathlib import Path

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


def table(
    path, time_factor=None, memory_factor=1.0, limit_gb=None, engine=None, column=False
) -> dict:
    """A replay table of the space of ``path``: the cost model's step time (as ``engine``
    prices it; default: as the study's prior does) with each candidate's parts scaled by
    ``time_factor(candidate, part)``, its peak × ``memory_factor`` (a callable: of the
    candidate); a candidate whose true peak is over ``limit_gb`` ran out of memory; ``column``:
    with an ``engine`` column saying so. Returns candidate → goodput (None: out of memory)."""
    from autotune.costmodel import estimate
    from autotune.spec.model_yaml import load_spec
    from autotune.spec.space import build_space

    spec = load_spec(path)
    truth = {}
    with open(path.parent / "table.csv", "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(
            [*KNOB_NAMES, "goodput", "step_time_ms", "peak_memory_mb", "outcome"]
            + (["engine"] if column else [])
        )
        for c in build_space(spec).candidates():
            est = estimate(spec, c, engine=engine)
            if not est.breakdown:
                continue
            seconds = sum(
                v * (time_factor(c, k) if time_factor else 1.0)
                for k, v in est.breakdown["time_s"].items()
            )
            factor = memory_factor(c) if callable(memory_factor) else memory_factor
            memory = est.memory_gb_per_device * factor
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
                + ([engine] if column else [])
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


def test_where_a_mechanism_is_mispriced_no_split_within_its_error_waits_for_polishing(tmp_path):
    """The model prices pipelined steps 1/0.6× too dear, so it ranks data parallelism first.
    No trial polishes — runs a variant of a measured split that its estimate says changes less
    than one run's noise (a fusion threshold, the parallel optimizer) — while a parallel split
    that has not run is within the model's demonstrated error of the best measured candidate
    (the band), or a parallel mechanism nothing measured uses is within the wide band; the
    study finds the truth's best."""
    from autotune.search.acquisition import LIKELY

    path = spec_file(tmp_path)
    truth = table(path, lambda c, part: 0.6 if c.pp > 1 else 1.0)
    storage = f"sqlite:///{tmp_path}/s.db"
    assert main(["search", str(path), "--storage", storage, "--trials", "10"]) == 0
    trials = ran(storage)
    banded = polished = 0
    for t in trials[1:]:
        prior = _prior_before(path, trials, t.number)
        measured, fits, open_ = prior.open_candidates(_measured_before(trials, t.number))
        gain, _ = prior.values()
        band, wide = prior.bands(gain, float(gain[measured].max()), open_ & (fits >= LIKELY))
        _, uses = prior.split_arrays()
        unmeasured = wide & (uses & ~uses[measured].any(axis=0)).any(axis=1)
        banded += bool(band.any())
        if prior.polishes(prior.index[prior.project(candidate_of(t))], gain, measured):
            polished += 1
            assert not band.any() and not unmeasured.any(), t.number
    assert banded and polished  # the measurements showed the model wrong; the study polished
    best = max(t.values[0] for t in trials if t.values)
    assert best == pytest.approx(max(g for g in truth.values() if g))


def test_where_measurements_agree_with_the_model_the_study_exploits_its_best(tmp_path):
    """The table is the model's own estimate, whose best is a fusion threshold of the baseline's
    split, 0.1 % better than it: the study finds it, and opens another parallel split only for
    a mechanism no trial before it used (data parallel alone, tp > 1 without pipeline stages,
    pp > 1 without tp, both, a recompute mode) — never a second split of one."""
    from autotune.search.acquisition import mechanisms_of

    path = spec_file(tmp_path)
    truth = table(path)
    storage = f"sqlite:///{tmp_path}/s.db"
    assert main(["search", str(path), "--storage", storage, "--trials", "8"]) == 0
    trials = ran(storage)
    assert max(t.values[0] for t in trials) == pytest.approx(max(g for g in truth.values() if g))
    seen, used = set(), set()
    for t in trials:
        c = candidate_of(t)
        split = (c.dp, c.tp, c.pp)
        if split not in seen and len(seen) >= 2:
            assert mechanisms_of(c) - used, t.number
        seen.add(split)
        used |= mechanisms_of(c)


def _measured_before(trials, number):
    """The measurements of ``trials`` before trial ``number``, as the prior takes them."""
    return [
        (candidate_of(t), t.user_attrs["peak_memory_mb"], t.user_attrs["step_time_ms"])
        for t in trials
        if t.number < number and t.values
    ]


def _prior_before(path, trials, number):
    """The prior as it stood before trial ``number`` was proposed."""
    from autotune.search.prior import Prior
    from autotune.spec.model_yaml import load_spec
    from autotune.spec.space import build_space

    spec = load_spec(path)
    prior = Prior(spec, build_space(spec), 0)
    for t in trials:
        if t.number >= number:
            break
        prior.mark(candidate_of(t), schema.outcome_of(t))
    return prior


def test_measuring_a_mechanism_shrinks_its_uncertainty_more_than_the_others(tmp_path):
    from autotune.search.prior import Prior
    from autotune.spec.model_yaml import load_spec
    from autotune.spec.space import build_space

    path = spec_file(tmp_path)
    truth = table(path, lambda c, part: 1.5 if part == "bubble" else 1.0)
    spec = load_spec(path)
    prior = Prior(spec, build_space(spec), 0)
    baseline = build_space(spec).baseline()
    pipelined = [c for c in truth if c.pp == 2 and c.tp == 1 and truth[c]][:3]
    measured = [(c, 1000.0, 64 / truth[c] * 1000) for c in [baseline, *pipelined]]
    for c in [baseline, *pipelined]:
        prior.mark(c, "ok")
    prior.next(measured)
    sd = prior.belief.mechanism_sd()
    # the pipeline was measured (its stage compute, bubble and transfers): known better than
    # tp, which never ran (tp = 1 everywhere) — if less than 0.6× since each measured layout
    # may have an effect of its own (docs/search.md, "How sure the prior is")
    assert sd["pipeline"] < 0.75 * sd["tp"]
    # so a tp layout's value is less certain than another pipelined variant's
    _, layout_var = prior.belief.predict()
    tp4 = [prior.index[c] for c in prior.candidates if c.tp == 4 and c.pp == 1]
    pp2 = [prior.index[c] for c in prior.candidates if layout(c) == layout(pipelined[0])]
    assert np.median(layout_var[tp4]) > 4 * np.median(layout_var[pp2])
    # measuring tp shrinks what its layout may cost, much more than its mechanism alone
    tp_runs = [c for c in truth if c.tp == 4 and c.pp == 1 and truth[c]][:2]
    for c in tp_runs:
        prior.mark(c, "ok")
    prior.next(measured + [(c, 1000.0, 64 / truth[c] * 1000) for c in tp_runs])
    assert prior.belief.mechanism_sd()["tp"] < sd["tp"]
    _, after = prior.belief.predict()
    ran_tp4 = [i for i in tp4 if layout(prior.candidates[i]) == layout(tp_runs[0])]
    assert np.median(after[ran_tp4]) < 0.6 * np.median(layout_var[ran_tp4])
    # the tp4 layouts that did not run keep what is their own (their whole step's unexplained
    # part: docs/search.md), less what they share with the one that ran
    assert np.median(after[tp4]) < 0.8 * np.median(layout_var[tp4])


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


def test_where_the_memory_model_is_exact_a_study_runs_past_the_cap_at_most_once(tmp_path):
    """On an 8 GB device many of the fastest candidates are estimated over the cap, and so they
    are (the table's peaks are the estimates, over the cap an ``oom`` row). A study runs past
    the cap at most once — a candidate just at it, whose peak no measurement can settle — and
    never walks a ladder of candidates each a little smaller than the last that ran out; every
    trial is the prior's."""
    from autotune.costmodel import SAFETY_MARGIN, estimate
    from autotune.spec.model_yaml import load_spec

    path = spec_file(
        tmp_path, "{base: a100-80g, memory_gb: 8}", "baseline: {grad_accum: 4, recompute: full}\n"
    )
    cap = 8 * SAFETY_MARGIN
    truth = table(path, limit_gb=cap)
    spec = load_spec(path)
    over = {c for c in truth if estimate(spec, c).memory_gb_per_device > cap}
    fastest = sorted(truth, key=lambda c: sum(estimate(spec, c).breakdown["time_s"].values()))[:10]
    assert len(over & set(fastest)) >= 5  # a ladder there is to walk
    storage = f"sqlite:///{tmp_path}/s.db"
    assert main(["search", str(path), "--storage", storage, "--trials", "12"]) == 0
    trials = ran(storage)
    assert len(trials) == 12
    assert sum(schema.outcome_of(t) == "oom" for t in trials) <= 1
    assert all(t.user_attrs.get("proposed_by") == "prior" for t in trials[1:])
    best = max(t.values[0] for t in trials if t.values)
    assert best == pytest.approx(max(g for g in truth.values() if g))


def test_peaks_and_out_of_memory_runs_that_disagree_widen_the_belief_and_the_prior_goes_on(
    tmp_path,
):
    """The model prices non-pipelined activations 1.6× too low and pipelined ones 0.5× too
    high: one memory factor cannot explain both the peaks measured and the runs out of memory.
    Every trial after the baseline is still the prior's (none left to a sampler that knows
    nothing of memory), no candidate estimated as large as one that ran out runs, and every
    candidate that may fit keeps a probability to fit."""
    from autotune.costmodel import SAFETY_MARGIN, estimate
    from autotune.spec.model_yaml import load_spec

    path = spec_file(tmp_path, "{base: a100-80g, memory_gb: 12}", "baseline: {pp: 2}\n")
    cap = 12 * SAFETY_MARGIN
    truth = table(path, memory_factor=lambda c: 0.5 if c.pp > 1 else 1.6, limit_gb=cap)
    storage = f"sqlite:///{tmp_path}/s.db"
    assert main(["search", str(path), "--storage", storage, "--trials", "10"]) == 0
    trials = ran(storage)
    assert any(schema.outcome_of(t) == "oom" for t in trials)
    assert all(t.user_attrs.get("proposed_by") == "prior" for t in trials[1:])
    spec = load_spec(path)
    ooms = [candidate_of(t) for t in trials if schema.outcome_of(t) == "oom"]
    first_oom = min(t.number for t in trials if schema.outcome_of(t) == "oom")
    for t in trials:
        if t.number > first_oom and candidate_of(t).pp == ooms[0].pp:
            assert (
                estimate(spec, candidate_of(t)).memory_gb_per_device
                < estimate(spec, ooms[0]).memory_gb_per_device
            ) or layout(candidate_of(t)) != layout(ooms[0])
    prior = _prior_before(path, trials, trials[-1].number + 1)
    fits = prior.belief.fit_probability()
    assert fits.max() > 0.5 and np.isfinite(fits).all()
    assert any(truth[c] for c in truth)


def test_four_trial_slots_take_four_layouts(tmp_path):
    """With a pool of four trials' devices, the proposals made while others run account for
    them: the first four trials are four layouts."""
    path = spec_file(tmp_path)
    text = path.read_text().replace(
        "devices_per_node: 8,", "devices_per_node: 8, pool_devices: 32,"
    )
    path.write_text(text)
    table(path, lambda c, part: 1.3 if part == "tp_comm" else 1.0)
    storage = f"sqlite:///{tmp_path}/s.db"
    assert main(["search", str(path), "--storage", storage, "--trials", "8"]) == 0
    trials = ran(storage)
    assert len({layout(candidate_of(t)) for t in trials[:4]}) == 4


def test_a_table_of_runs_of_mindspores_engine_is_priced_as_that_engine(tmp_path, capsys):
    """A replay table whose engine column says its rows ran MindSpore's own engine: the prior
    prices that program, so the best by that engine (well ahead of the slow baseline: recompute
    full) is what runs after the baseline. A model.yaml that says otherwise is refused, naming
    the field."""
    path = spec_file(tmp_path, extra="baseline: {recompute: full, tp: 4}\n")
    truth = table(path, engine="mindspore", column=True)
    storage = f"sqlite:///{tmp_path}/s.db"
    assert main(["search", str(path), "--storage", storage, "--trials", "2"]) == 0
    assert "ran the mindspore engine" in capsys.readouterr().out
    assert ran(storage)[1].values[0] == pytest.approx(max(g for g in truth.values() if g))
    # the same table unlabelled: the prior prices autotune's trainer, and misses it
    table(path, engine="mindspore")
    unlabelled = f"sqlite:///{tmp_path}/u.db"
    assert main(["search", str(path), "--storage", unlabelled, "--trials", "2"]) == 0
    assert ran(unlabelled)[1].values[0] < 0.99 * max(g for g in truth.values() if g)

    table(path, engine="mindspore", column=True)
    path.write_text(
        path.read_text().replace("device: a100-80g", "device: a100-80g, replay_engine: trainer")
    )
    assert main(["search", str(path), "--storage", storage, "--trials", "2", "--study", "x"]) == 2
    err = capsys.readouterr().err
    assert "cluster.replay_engine: trainer" in err and "mindspore" in err


def test_belief_prices_every_part_of_the_estimate():
    """The belief's parts are the estimate's: an MoE candidate's experts, all-to-alls and latent
    attention are mechanisms the measurements correct, not time the belief leaves out."""
    from autotune.costmodel import estimate
    from autotune.search.belief import PARTS
    from autotune.search.prior import raw_parts
    from autotune.spec.model_yaml import load_spec
    from autotune.spec.space import build_space

    spec = load_spec(Path("examples/deepseek_v3_2048dev_simulate.yaml"))
    est = estimate(spec, build_space(spec).baseline())
    assert set(est.breakdown["time_s"]) == set(PARTS)
    assert raw_parts(est).sum() == pytest.approx(est.step_time_s, rel=1e-12)
    assert est.breakdown["time_s"]["ep_comm_inter"] > 0
