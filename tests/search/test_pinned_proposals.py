"""The same seed proposes the same candidates in the same order: every trial of four studies —
the tiny GPT replayed from a table (it runs on this CPU otherwise) and the 64-device LLaMA-7B
simulate example, each with sampler ``auto`` and ``tpe`` — against what they stored when this
was pinned (tests/fixtures/pinned_proposals.json): params, knobs, outcome, values and role, in
trial order, the tiny GPT's confirm phase included. A change to how the driver stores or
reads trials (to keep the driver light) must leave all of it as it was.

A change meant to propose otherwise (the cost model, the prior, a sampler) regenerates the file
with ``.venv/bin/python -m tests.search.test_pinned_proposals`` and says so in its commit.
"""

import csv
import json
import math
import sys
import tempfile
from pathlib import Path

import optuna
import pytest
import yaml

from tests.conftest import ROOT

PINNED = ROOT / "tests" / "fixtures" / "pinned_proposals.json"
STUDIES = [("tiny-gpt", "auto"), ("tiny-gpt", "tpe"), ("llama7b-64", "auto"), ("llama7b-64", "tpe")]
ROLES = ("baseline", "repeat_of", "confirm_of", "retry_of", "proposed_by")


def _table(spec, path: Path) -> None:
    """A replay table of the tiny GPT's space that owes nothing to the cost model: goodput
    and loss from the knobs alone, two runs per candidate (so a confirm phase runs), and some
    candidates missing (so some proposals are infeasible) or out of memory."""
    from autotune.spec.knobs import KNOB_NAMES
    from autotune.spec.space import build_space

    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(
            [
                *KNOB_NAMES,
                "goodput",
                "step_time_ms",
                "peak_memory_mb",
                "loss_last",
                "outcome",
                "run_s",
            ]
        )
        for i, c in enumerate(build_space(spec).candidates()):
            if i % 7 == 3:
                continue  # not in the table: infeasible
            base = (
                100
                / (c.tp * c.pp**0.5)
                * (1 + 0.1 * math.log2(c.fusion_mb))
                * (0.8 if c.recompute == "full" else 1)
                * (1.05 if c.grad_accum == 2 else 1)
            )
            loss = 3 + abs(math.log2(c.loss_scale) - 14) / 20 + abs(c.warmup_steps - 200) / 1000
            oom = c.recompute == "none" and c.pp == 2 and c.micro_batches == 2
            for run in range(2):
                goodput = base * (1 + 0.03 * ((i * 7 + run * 3) % 5 - 2))
                writer.writerow(
                    [
                        *(getattr(c, k) for k in KNOB_NAMES),
                        "" if oom else goodput,
                        1000 * 32 / goodput,
                        900 + 10 * c.tp,
                        "" if oom else loss + 0.01 * run,
                        "oom" if oom else "ok",
                        30,
                    ]
                )


def run(which: str, sampler: str, folder: Path) -> list[dict]:
    """Run one of :data:`STUDIES` in ``folder``; every trial as the pin compares it."""
    from autotune.cli import main

    source = {"tiny-gpt": "tiny_gpt.yaml", "llama7b-64": "llama7b_64dev_simulate.yaml"}[which]
    data = yaml.safe_load((ROOT / "examples" / source).read_text())
    if which == "tiny-gpt":
        data["cluster"].update(backend="replay", replay="table.csv", device="cpu")
    (folder / "model.yaml").write_text(yaml.safe_dump(data))
    if which == "tiny-gpt":
        from autotune.spec.model_yaml import load_spec

        _table(load_spec(folder / "model.yaml"), folder / "table.csv")
    storage = f"sqlite:///{folder}/s.db"
    assert (
        main(
            [
                "search",
                str(folder / "model.yaml"),
                "--storage",
                storage,
                "--sampler",
                sampler,
                "--study",
                "pin",
                "--artifacts",
                str(folder / "trials"),
            ]
        )
        == 0
    )
    study = optuna.load_study(study_name="pin", storage=storage)
    from autotune.storage.schema import knobs_of

    return [
        {
            "number": t.number,
            "state": t.state.name,
            "params": t.params,
            "knobs": knobs_of(t),
            "outcome": t.user_attrs.get("outcome"),
            "values": t.values,
            **{k: t.user_attrs[k] for k in ROLES if k in t.user_attrs},
        }
        for t in study.trials
    ]


@pytest.mark.parametrize("which,sampler", STUDIES)
def test_the_same_seed_proposes_what_it_proposed_when_pinned(tmp_path, which, sampler, capsys):
    pinned = json.loads(PINNED.read_text())[f"{which}/{sampler}"]
    trials = json.loads(json.dumps(run(which, sampler, tmp_path)))  # as the file holds them
    assert len(trials) == len(pinned)
    for now, then in zip(trials, pinned):
        assert now == then, f"trial #{then['number']}"


if __name__ == "__main__":  # regenerate the pin (see the module doc)
    import autotune

    print(f"pinning what {Path(autotune.__file__).parent} proposes", file=sys.stderr)
    out = {}
    for which, sampler in STUDIES:
        with tempfile.TemporaryDirectory() as folder:
            out[f"{which}/{sampler}"] = run(which, sampler, Path(folder))
    PINNED.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {PINNED}: " + ", ".join(f"{k} {len(v)} trials" for k, v in out.items()))
