"""What the study proposes, on the simulate backend into real Optuna storage: ordered knobs,
older studies that resume with their own params."""

import textwrap

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, IntDistribution

import autotune
from autotune.cli import main
from autotune.spec.knobs import KNOB_NAMES
from autotune.storage import counting, schema
from tests.conftest import SIM8_MODEL

SIMULATE = (
    "study: sim\n"
    + SIM8_MODEL
    + """\
cluster: {backend: simulate, devices: 8, devices_per_node: 8, device: a100-80g}
search:
  space: {tp: [1, 2, 4], pp: [1, 2], micro_batches: [2, 4], fusion_mb: [16, 256],
          grad_accum: [1, 2, 3], loss_scale: 65536, warmup_steps: 0, jit_level: O1,
          recompute: [none, full]}
  n_trials: 8
  seed: 0
"""
)


def write(tmp_path, text, name="model.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_numeric_knobs_reach_the_sampler_as_ordered_distributions(tmp_path):
    path = write(tmp_path, SIMULATE)
    storage = f"sqlite:///{tmp_path}/s.db"
    assert main(["search", str(path), "--storage", storage, "--sampler", "tpe"]) == 0
    study = optuna.load_study(study_name="sim", storage=storage)
    expected = {
        "log2_tp": IntDistribution(0, 2),
        "log2_pp": IntDistribution(0, 1),
        "log2_fusion_mb": IntDistribution(4, 8, step=4),
        "log2_micro_batches": IntDistribution(1, 2),
        "grad_accum": IntDistribution(1, 3),
        "recompute": CategoricalDistribution(["none", "full"]),
        "parallel_optimizer": CategoricalDistribution([False, True]),
    }
    seen = {}
    for t in study.trials:
        seen.update(t.distributions)
    assert seen == expected
    # what TPE models jointly: the integer params every trial has, as integers
    relative = optuna.samplers.TPESampler(multivariate=True).infer_relative_search_space(
        study, study.trials[-1]
    )
    assert relative["log2_tp"] == IntDistribution(0, 2)
    # fusion_mb acts only with dp > 1 (a dp = 1 trial does not sample it): jointly over those
    from optuna.search_space import intersection_search_space

    with_dp = [
        t
        for t in study.trials
        if t.state == optuna.trial.TrialState.COMPLETE and schema.knobs_of(t)["dp"] > 1
    ]
    assert intersection_search_space(with_dp)["log2_fusion_mb"] == IntDistribution(4, 8, step=4)
    # every knob stays readable under its own name, as the candidate that ran
    frame = autotune.trials_frame("sim", storage)
    for knob in KNOB_NAMES:
        assert frame[knob].notna().all(), knob
    for t in study.trials:
        knobs = schema.knobs_of(t)
        assert 2 ** t.params["log2_tp"] == knobs["tp"]
        assert knobs["dp"] * knobs["tp"] * knobs["pp"] == 8
        if knobs["pp"] == 1:
            assert (
                t.params["grad_accum"] == knobs["grad_accum"] and "grad_accum" not in t.user_attrs
            )


def legacy_study(path, storage, trials):
    """A study as autotune wrote it before ordered knobs: every knob a categorical param named
    after it, no ``param_encoding`` attr; ``trials``: finished candidates, then one a killed
    driver left RUNNING."""
    from dataclasses import replace

    from autotune.spec.model_yaml import load_spec
    from autotune.spec.space import build_space
    from autotune.study.opening import fingerprint

    spec = load_spec(path)
    space = replace(build_space(spec), encoding="categorical")
    study = optuna.create_study(storage=storage, study_name="sim", direction="maximize")
    for key, value in (
        ("model_yaml", spec.raw),
        ("model_yaml_path", spec.source),
        ("objectives", ["goodput"]),
        ("backend", "simulate"),
        ("fingerprint", fingerprint(spec, space)),
    ):
        study.set_user_attr(key, value)
    distributions = space.distributions()
    for candidate in trials[:-1]:
        params = space.params_of(candidate)
        study.add_trial(
            optuna.trial.create_trial(
                value=1.0,
                params=params,
                distributions={k: distributions[k] for k in params},
                user_attrs={"outcome": "ok", "goodput": 1.0, **space.attrs_of(candidate)},
            )
        )
    study.enqueue_trial(space.params_of(trials[-1]))
    space.sample(study.ask())
    return study


def test_a_study_created_before_ordered_knobs_resumes_with_its_categorical_params(tmp_path, capsys):
    from autotune.spec.candidate import Candidate

    path = write(tmp_path, SIMULATE)
    storage = f"sqlite:///{tmp_path}/s.db"
    base = dict(
        dp=8,
        tp=1,
        pp=1,
        micro_batches=1,
        fusion_mb=16,
        grad_accum=1,
        loss_scale=65536,
        warmup_steps=0,
        jit_level="O1",
        recompute="none",
    )
    old = [
        Candidate(**base),
        Candidate(**base | {"dp": 4, "tp": 2}),
        Candidate(**base | {"dp": 2, "tp": 2, "pp": 2, "micro_batches": 4}),
    ]
    legacy_study(path, storage, old)
    assert (
        main(
            [
                "search",
                str(path),
                "--storage",
                storage,
                "--trials",
                "5",
                "--resume",
                "--sampler",
                "tpe",
            ]
        )
        == 0
    )
    assert (
        "'sim' was created before ordered knobs: its knobs stay categorical params"
        in capsys.readouterr().out
    )
    study = optuna.load_study(study_name="sim", storage=storage)
    for t in study.trials:
        assert all(isinstance(d, CategoricalDistribution) for d in t.distributions.values())
        assert set(t.params) <= set(KNOB_NAMES)
    frame = autotune.trials_frame("sim", storage)
    assert frame.loc[2, "outcome"] == "interrupted"
    # the interrupted candidate ran again, with the params it had
    rerun = [t for t in study.trials[3:] if t.params == study.trials[2].params]
    assert rerun and rerun[0].user_attrs["outcome"] == "ok"
    counted = frame[(frame["outcome"] != "interrupted") & frame["repeat_of"].isna()]
    assert len(counted) == 5 and counted[list(KNOB_NAMES)].notna().all().all()


def test_a_study_of_an_unknown_param_encoding_is_refused(tmp_path, capsys):
    path = write(tmp_path, SIMULATE)
    storage = f"sqlite:///{tmp_path}/s.db"
    assert main(["search", str(path), "--storage", storage, "--trials", "2"]) == 0
    optuna.load_study(study_name="sim", storage=storage).set_user_attr("param_encoding", "spiral")
    capsys.readouterr()
    assert main(["search", str(path), "--storage", storage, "--trials", "3", "--resume"]) == 2
    assert "samples its knobs as 'spiral'" in capsys.readouterr().err


@pytest.mark.parametrize(
    "domain, name, distribution, values",
    [
        ((1, 2, 4, 8), "log2_tp", IntDistribution(0, 3), (1, 2, 4, 8)),
        ((64, 1, 4, 16), "log2_tp", IntDistribution(0, 6, step=2), (1, 4, 16, 64)),
        ((0, 100, 200), "tp", IntDistribution(0, 200, step=100), (0, 100, 200)),
        ((1, 2, 8), "tp_index", IntDistribution(0, 2), (1, 2, 8)),
    ],
)
def test_each_numeric_domain_gets_an_ordered_param_that_round_trips(
    domain, name, distribution, values
):
    from autotune.spec.encoding import param_for

    param = param_for("tp", domain, "ordered")
    assert (param.name, param.distribution, param.values) == (name, distribution, values)
    for value in domain:
        raw = param.encode(value)
        assert distribution._contains(raw) and param.decode(raw) == value
    assert param_for(
        "recompute", ("none", "full"), "ordered"
    ).distribution == CategoricalDistribution(["none", "full"])


def test_plain_samplers_open_with_the_baseline_and_one_trial_per_layout(tmp_path):
    from autotune.spec.model_yaml import load_spec
    from autotune.spec.space import build_space

    path = write(tmp_path, SIMULATE)
    storage = f"sqlite:///{tmp_path}/s.db"
    assert main(["search", str(path), "--storage", storage, "--sampler", "random"]) == 0
    space = build_space(load_spec(path))
    openers = [space.baseline(), *space.layout_openers(load_spec(path))]
    frame = autotune.trials_frame("sim", storage)
    ran = [tuple(row) for row in frame[list(KNOB_NAMES)].values[: len(openers)]]
    assert ran == [tuple(c.as_dict().values()) for c in openers]


REPLAY = SIMULATE.replace("backend: simulate", "backend: replay, replay: table.csv")
BIAS = {1: 1.0, 2: 1.3, 4: 0.7}  # the "measured" world: tp 2 faster, tp 4 slower than estimated


def estimated_table(path, tmp_path) -> dict:
    """A replay table of every feasible candidate: the estimate, off by :data:`BIAS` per tp.
    Returns candidate → goodput."""
    import csv

    from autotune.costmodel import estimate
    from autotune.spec.model_yaml import load_spec
    from autotune.spec.space import build_space

    spec = load_spec(path)
    truth = {}
    with open(tmp_path / "table.csv", "w", newline="") as f:
        out = csv.writer(f)
        out.writerow([*KNOB_NAMES, "goodput", "step_time_ms", "peak_memory_mb"])
        for c in build_space(spec).candidates():
            est = estimate(spec, c)
            if est.feasible:
                truth[c] = est.samples_per_s * BIAS[c.tp]
                out.writerow(
                    [
                        *c.as_dict().values(),
                        truth[c],
                        est.step_time_s * 1000 / BIAS[c.tp],
                        est.memory_gb_per_device * 1024,
                    ]
                )
    return truth


def test_auto_runs_the_baseline_then_the_priors_best_and_never_a_candidate_twice(tmp_path, capsys):
    from autotune.search.prior import Prior
    from autotune.spec.candidate import Candidate
    from autotune.spec.model_yaml import load_spec
    from autotune.spec.space import build_space

    path = write(tmp_path, REPLAY)
    truth = estimated_table(path, tmp_path)
    storage = f"sqlite:///{tmp_path}/s.db"
    assert main(["search", str(path), "--storage", storage, "--trials", "4"]) == 0  # auto: default
    assert "auto: the cost model ranks" in capsys.readouterr().out
    study = optuna.load_study(study_name="sim", storage=storage)
    trials = study.trials
    assert trials[0].user_attrs["baseline"] and "proposed_by" not in trials[0].user_attrs
    assert all(t.user_attrs["proposed_by"] == "prior" for t in trials[1:])
    # the first proposal after the baseline: the prior's best, given the baseline's measurement
    spec = load_spec(path)
    prior = Prior(spec, build_space(spec))
    baseline = Candidate(**schema.knobs_of(trials[0]))
    measured = [
        (baseline, trials[0].user_attrs["peak_memory_mb"], trials[0].user_attrs["step_time_ms"])
    ]
    prior.mark(baseline, "ok")
    expected, _ = prior.next(measured)
    assert Candidate(**schema.knobs_of(trials[1])) == expected

    # resumed, it goes on where it was: never a candidate that ran, and finds the measured best
    assert main(["search", str(path), "--storage", storage, "--trials", "12", "--resume"]) == 0
    frame = autotune.trials_frame("sim", storage)
    assert len(frame) == 12 and frame["repeat_of"].isna().all()
    assert len({tuple(row) for row in frame[list(KNOB_NAMES)].values}) == 12
    assert frame["goodput"].max() == pytest.approx(max(truth.values()))


def test_a_warm_start_runs_nothing_measured_before_and_starts_from_the_warm_prior(tmp_path, capsys):
    from autotune.search.prior import Prior
    from autotune.spec.candidate import Candidate
    from autotune.spec.model_yaml import load_spec
    from autotune.spec.space import build_space

    path = write(tmp_path, REPLAY)
    estimated_table(path, tmp_path)
    storage = f"sqlite:///{tmp_path}/s.db"
    assert (
        main(
            [
                "search",
                str(path),
                "--storage",
                storage,
                "--study",
                "first",
                "--trials",
                "7",
                "--sampler",
                "random",
            ]
        )
        == 0
    )
    assert (
        main(
            [
                "search",
                str(path),
                "--storage",
                storage,
                "--study",
                "second",
                "--trials",
                "4",
                "--warm-start",
                "first",
            ]
        )
        == 0
    )
    first = optuna.load_study(study_name="first", storage=storage)
    second = optuna.load_study(study_name="second", storage=storage)
    ran_first = [
        t for t in first.trials if counting.counted(t) and t.user_attrs["outcome"] != "infeasible"
    ]
    measured = {Candidate(**schema.knobs_of(t)) for t in ran_first}
    copies = [t for t in second.trials if "warm_start" in t.user_attrs]
    assert sorted(t.user_attrs["warm_start"] for t in copies) == sorted(
        f"first#{t.number}" for t in ran_first
    )
    # nothing the first study measured runs again (the baseline is answered from memory)
    ran_second = [t for t in second.trials if counting.counted(t)]
    assert len(ran_second) == 4
    assert not measured & {Candidate(**schema.knobs_of(t)) for t in ran_second}
    assert any(t.user_attrs.get("baseline") and "repeat_of" in t.user_attrs for t in second.trials)
    # the first proposal after the baseline: the best under the prior the first study informed
    spec = load_spec(path)
    prior = Prior(spec, build_space(spec))
    measured = []
    for t in ran_first:
        c = Candidate(**schema.knobs_of(t))
        prior.mark(c, t.user_attrs["outcome"])
        if t.user_attrs["outcome"] == "ok":
            measured.append((c, t.user_attrs["peak_memory_mb"], t.user_attrs["step_time_ms"]))
    proposed = next(t for t in second.trials if t.user_attrs.get("proposed_by") == "prior")
    expected, _ = prior.next(measured)
    assert Candidate(**schema.knobs_of(proposed)) == expected
    # the best the first study found is the second's best too, unless it found better
    assert second.best_value >= first.best_value
    # a resume brings nothing in twice
    assert (
        main(
            [
                "search",
                str(path),
                "--storage",
                storage,
                "--study",
                "second",
                "--trials",
                "5",
                "--warm-start",
                "first",
                "--resume",
            ]
        )
        == 0
    )
    second = optuna.load_study(study_name="second", storage=storage)
    assert len([t for t in second.trials if "warm_start" in t.user_attrs]) == len(copies)

    # another model is refused, naming what differs; nothing is written
    other = write(tmp_path, REPLAY.replace("hidden_size: 1024", "hidden_size: 2048"), "other.yaml")
    capsys.readouterr()
    assert (
        main(
            [
                "search",
                str(other),
                "--storage",
                storage,
                "--study",
                "third",
                "--warm-start",
                "first",
            ]
        )
        == 2
    )
    assert "--warm-start first: it measured another model" in capsys.readouterr().err
    assert "third" not in optuna.get_all_study_names(storage)


def test_every_sampler_name_has_a_sampler_and_no_other_name_does():
    # the names search.sampler and --sampler accept (one tuple, in the spec) against the factory
    import importlib.util

    from autotune.search.samplers import SAMPLERS, make_sampler
    from autotune.spec.errors import SpecError

    extras = {"cmaes": ("cmaes",), "gp": ("torch", "scipy")}  # pyproject's optional extras
    for name in SAMPLERS:
        missing = [p for p in extras.get(name, ()) if importlib.util.find_spec(p) is None]
        if missing:  # an input error naming the extra to install, never a crash
            with pytest.raises(SpecError, match=rf"autotune\[{name}\]"):
                make_sampler(name, seed=0, n_trials=8)
        else:
            assert isinstance(make_sampler(name, seed=0, n_trials=8), optuna.samplers.BaseSampler)
    with pytest.raises(SpecError, match="search.sampler: must be one of auto, tpe"):
        make_sampler("bayes", seed=0, n_trials=8)
