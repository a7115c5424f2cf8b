"""A study with no ok trial (every candidate infeasible) is reported, shown and compared with
each missing figure and figure named with the reason, never a traceback.
A real simulate study into SQLite, through the CLI: no rejection counts toward its 4 trials, so
it ends when the space is exhausted."""

import re
import textwrap

import optuna

from autotune.cli import main
from tests.conftest import SIM8_MODEL

NONE_FITS = (
    "study: none\n"
    + SIM8_MODEL
    + """\
cluster: {backend: simulate, devices: 8, devices_per_node: 8, device: a100-80g,
          device_memory_gb: 0.01}
search:
  space: {tp: [1, 2, 4], pp: [1, 2], micro_batches: [2, 4], fusion_mb: [16, 256],
          grad_accum: [1, 2], loss_scale: 65536, warmup_steps: 0, jit_level: O1,
          recompute: [none, full]}
  n_trials: 4
"""
)


def study(tmp_path, capsys):
    """(storage, why there is no best: every trial the study recorded was rejected)."""
    path = tmp_path / "model.yaml"
    path.write_text(textwrap.dedent(NONE_FITS))
    storage = f"sqlite:///{tmp_path}/s.db"
    assert main(["search", str(path), "--storage", storage]) == 0
    assert (
        "the space is exhausted: every candidate has run or is infeasible (0 ran, 84 infeasible)"
        in capsys.readouterr().out
    )
    trials = optuna.load_study(study_name="none", storage=storage).trials
    assert {t.user_attrs["outcome"] for t in trials} == {"infeasible"}
    return storage, f"no trial finished ok (infeasible {len(trials)})"


def test_report_names_every_figure_it_cannot_draw(tmp_path, capsys):
    storage, why = study(tmp_path, capsys)
    assert main(["report", "none", "--storage", storage, "--out", str(tmp_path / "r")]) == 0
    page = (tmp_path / "r" / "index.html").read_text()
    missing = re.findall(r"\(no figure (\w+): ([^)]*\))\)", page)
    assert [name for name, _ in missing] == [
        "history",
        "importances",
        "parallel",
        "slice",
        "memory",
        "estimate",
        "breakdown",
    ]
    assert all(why == why for _, why in missing)
    assert f"best: none: {why}" in page
    assert "baseline: #0 infeasible, no goodput" in page


def test_show_and_compare_say_why_there_is_no_best(tmp_path, capsys):
    storage, why = study(tmp_path, capsys)
    assert main(["show", "none", "--storage", storage]) == 0
    out = capsys.readouterr().out
    assert f"best: none: {why}" in out and "baseline: #0 infeasible, no goodput" in out
    assert main(["compare", "none", "--storage", storage]) == 0
    assert re.search(rf"no_best\s+{re.escape(why)}", capsys.readouterr().out)


def test_a_report_of_two_such_studies_names_the_shared_figure(tmp_path, capsys):
    storage, _ = study(tmp_path, capsys)
    path = tmp_path / "model.yaml"
    assert main(["search", str(path), "--storage", storage, "--study", "again"]) == 0
    assert (
        main(["report", "none", "again", "--storage", storage, "--out", str(tmp_path / "r")]) == 0
    )
    page = (tmp_path / "r" / "index.html").read_text()
    assert "(no figure studies-history: no study has a trial that finished ok)" in page
