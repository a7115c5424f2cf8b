"""A knob added from outside autotune/ — its entry (`register_knob`) and its hooks registered on
each side by its name, no edit under autotune/ — is searched by a simulate study and written by
`autotune export`: the door tests/house/test_knob_contracts.py keeps open. The registries are restored
after the test."""

import textwrap

import optuna
import pytest
import yaml

import autotune.export.configs  # noqa: F401  (the built-in writers, registered before the toy's)
import autotune.mindformers.config  # noqa: F401
from autotune.cli import main
from autotune.costmodel.knob_pricing import PRICES
from autotune.export.knob_writers import LAUNCH_YAML, MINDFORMERS_YAML
from autotune.spec import knobs
from autotune.spec.knobs import KNOBS, Knob, register_knob
from autotune.storage import schema
from autotune.train.knob_hooks import APPLIES
from tests.conftest import SMALL_CPU_SIMULATE
from tests.house.test_knob_contracts import gaps

TOY = "data_workers"
MODEL = (
    "study: toy\n"
    + SMALL_CPU_SIMULATE
    + """\
search:
  space: {tp: 1, pp: 1, fusion_mb: 64, grad_accum: 1, loss_scale: 1024, warmup_steps: 0,
          jit_level: O1, recompute: none, parallel_optimizer: false}
  n_trials: 6
  sampler: random
  seed: 0
"""
)
HOST_S = 0.05  # the toy's price: host seconds per step a data worker takes off


@pytest.fixture
def toy_knob():
    """The toy knob, registered through the public hooks; every registry restored after."""
    saved_knobs = dict(KNOBS)
    sides = (APPLIES, PRICES, LAUNCH_YAML, MINDFORMERS_YAML)
    saved = [(dict(side.hooks), dict(side.places)) for side in sides]
    register_knob(
        Knob(
            TOY,
            int,
            "data-loading workers per rank",
            "mindspore.dataset.GeneratorDataset(num_parallel_workers=N)",
            "train_dataset.num_parallel_workers",
            default=1,
            default_space=[1, 2, 3],
            graphs="none",
        )
    )

    @APPLIES.register(TOY)
    def apply(value, network, cfg):
        network.data_workers = value

    @PRICES.register(TOY)
    def price(value, spec, candidate, times, memory):
        times["host"] += HOST_S / value

    @LAUNCH_YAML.register(TOY)
    def launch(value, spec, candidate, doc):
        doc["dataset"] = {"num_parallel_workers": value}

    yield
    KNOBS.clear()
    KNOBS.update(saved_knobs)
    for side, (hooks, places) in zip(sides, saved):
        side.hooks.clear(), side.hooks.update(hooks)
        side.places.clear(), side.places.update(places)


def test_a_knob_added_outside_autotune_is_searched_and_exported(toy_knob, tmp_path):
    assert gaps(TOY) == [
        "export mindformers.yaml: no hook registered under 'data_workers' and no stated place"
    ]

    @MINDFORMERS_YAML.register(TOY)
    def mindformers(value, spec, candidate, document):
        document["train_dataset"] = {"num_parallel_workers": value}

    assert gaps(TOY) == []
    (tmp_path / "model.yaml").write_text(textwrap.dedent(MODEL))
    storage = f"sqlite:///{tmp_path}/toy.db"
    assert main(["search", str(tmp_path / "model.yaml"), "--storage", storage]) == 0
    trials = optuna.load_study(study_name="toy", storage=storage).trials
    searched = {t.params[TOY] for t in trials if TOY in t.params}
    assert len(searched) > 1 and searched <= {1, 2, 3}  # a param of its own, several values
    # priced by its hook: more workers, less host time per step
    by_value = {
        schema.knobs_of(t)[TOY]: t.user_attrs["step_time_ms"]
        for t in trials
        if t.user_attrs.get("outcome") == "ok"
    }
    assert sorted(by_value, key=by_value.get, reverse=True) == sorted(by_value)

    out = tmp_path / "export"
    assert main(["export", "toy", "--storage", storage, "--out", str(out)]) == 0
    launch = yaml.safe_load((out / "launch.yaml").read_text())
    best = launch["knobs"][TOY]["value"]
    assert best == 3  # the fastest, as priced
    assert launch["dataset"] == {"num_parallel_workers": best}
    assert launch["knobs"][TOY]["mindspore"].startswith("mindspore.dataset")
    overlay = yaml.safe_load((out / "mindformers.yaml").read_text())
    assert overlay["train_dataset"] == {"num_parallel_workers": best}
    assert (
        "data_workers  -> train_dataset.num_parallel_workers"
        in (out / "mindformers.yaml").read_text()
    )


def test_the_registries_are_as_built_after_the_toy(toy_knob):
    assert TOY in knobs.KNOB_NAMES  # the live view sees it


def test_register_knob_refuses_a_taken_or_unusable_name():
    with pytest.raises(ValueError, match="already taken"):
        register_knob(Knob("tp", int, "", "", "", default_space=[1]))
    with pytest.raises(ValueError, match="already taken"):
        register_knob(Knob("devices", int, "", "", "", default_space=[1]))
    with pytest.raises(ValueError, match="default_space"):
        register_knob(Knob("workers", int, "", "", ""))
    with pytest.raises(ValueError, match="choices"):
        register_knob(Knob("mode", str, "", "", "", default_space=["a"]))
    assert TOY not in KNOBS
