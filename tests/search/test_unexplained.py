"""What the cost model cannot see, the search measures: a miss no mechanism explains stays with
the layout it was measured on (and, more weakly, the layouts like it), and no parallel split
within the model's demonstrated error goes unmeasured.

The replay table of a LLaMA-7B shape on 64 Ascend 910B: every candidate's step as MindSpore's
engine prices it (the table says so: column ``engine``), times a whole-step factor no mechanism of
the belief has — each doubling of tp 18 % more goodput than priced, every pipelined layout 22 %
less — and per-run noise σ 0.06 (lognormal, 15 rows a candidate); over the cap, an ``oom`` row.
Real studies into real Optuna storage."""

import csv
import math
import textwrap

import numpy as np
import optuna
import pytest

from autotune.cli import main
from autotune.spec.knobs import KNOB_NAMES
from autotune.storage import counting, schema

MODEL = """\
study: unexplained
model: {family: transformer, num_layers: 32, hidden_size: 4096, num_heads: 32,
        ffn_hidden_size: 11008, seq_length: 4096, vocab_size: 32000, dtype: bfloat16}
train: {global_batch_size: 512, learning_rate: 3.0e-4, total_steps: 100000}
cluster: {backend: replay, replay: table.csv, devices: 64, devices_per_node: 8,
          device: ascend-910b}
search:
  space: {dp: auto, tp: [1, 2, 4, 8], pp: [1, 2, 4], micro_batches: [4, 8, 16, 32],
          fusion_mb: [4, 32, 256], grad_accum: [1, 2, 4], loss_scale: 65536,
          warmup_steps: 2000, jit_level: O1, recompute: [none, selective, full],
          parallel_optimizer: [false, true]}
  objectives: [goodput]
  seed: SEED
"""
TP_GAIN, PIPELINE_LOSS, NOISE, ROWS = 0.18, 0.22, 0.06, 15


def hidden(candidate) -> float:
    """The whole-step goodput factor the cost model has no term for."""
    return (1 + TP_GAIN) ** math.log2(candidate.tp) * (1 - PIPELINE_LOSS if candidate.pp > 1 else 1)


def write_study(tmp_path, seed: int) -> tuple:
    """The model.yaml and its table (see the module doc); returns (path, {candidate: noise-free
    goodput, 0 when out of memory})."""
    from autotune.costmodel import SAFETY_MARGIN, estimate, resolve_profile
    from autotune.spec.model_yaml import load_spec
    from autotune.spec.space import build_space

    path = tmp_path / "model.yaml"
    path.write_text(textwrap.dedent(MODEL).replace("SEED", str(seed)))
    spec = load_spec(path)
    cap = resolve_profile(spec.cluster).memory_gb * SAFETY_MARGIN
    rng = np.random.default_rng(seed)
    truth = {}
    with open(tmp_path / "table.csv", "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(
            [*KNOB_NAMES, "goodput", "step_time_ms", "peak_memory_mb", "outcome", "engine"]
        )
        for c in build_space(spec).candidates():
            est = estimate(spec, c, engine="mindspore")
            if not est.breakdown:
                continue
            if est.memory_gb_per_device > cap:
                truth[c] = 0.0
                out.writerow([*c.as_dict().values(), "", "", "", "oom", "mindspore"])
                continue
            step = est.step_time_s / hidden(c)
            truth[c] = 512 / step
            for s in step * rng.lognormal(0.0, NOISE, ROWS):
                row = [512 / s, s * 1000, est.memory_gb_per_device * 1024, "ok", "mindspore"]
                out.writerow([*c.as_dict().values(), *row])
    return path, truth


def runs(storage):
    study = optuna.load_study(study_name="unexplained", storage=storage)
    return [t for t in study.trials if counting.ran(t)]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_truth_the_model_has_no_mechanism_for_is_found_by_measuring_the_splits_it_ranks_lower(
    tmp_path, seed, capsys
):
    """The cost model ranks data parallelism and pipelines first and every tp > 1 layout at most
    0.82 of its best; in the truth tp8 is the best. Within 10 runs the study measures a tp > 1
    layout and reaches 0.97 of the noise-free optimum (issue 43: the search before ran the
    prior's own top 15 in its order and reached 0.89)."""
    from autotune.spec.candidate import Candidate

    path, truth = write_study(tmp_path, seed)
    storage = f"sqlite:///{tmp_path}/s.db"
    assert main(["search", str(path), "--storage", storage, "--trials", "10"]) == 0
    ran = runs(storage)[:10]
    assert len(ran) == 10
    found = [Candidate(**schema.knobs_of(t)).canonical() for t in ran]
    assert any(c.tp > 1 for c in found)
    optimum = max(truth.values())
    assert max(truth[c] for c in found) >= 0.97 * optimum
    # what autotune show says of the layouts that never ran: each one's reason
    layouts = optuna.load_study(study_name="unexplained", storage=storage).user_attrs["layouts"]
    skipped = [entry for entry in layouts if not entry["ran"]]
    assert skipped and all(entry["why"] for entry in skipped)
    capsys.readouterr()
    assert main(["show", "unexplained", "--storage", storage]) == 0
    out = capsys.readouterr().out
    assert f"layouts: {len(layouts) - len(skipped)} of {len(layouts)} ran" in out
    assert "predicted out of memory" in out and "demonstrated error" in out, out


def test_a_miss_stays_with_the_layout_it_was_measured_on(tmp_path):
    """dp32·pp2 measured 26 % under its estimate: its variants move down with it, the layouts
    like it (another pipelined split, another micro-batch count) nearly as much — the pipeline
    mechanism carries what it explains — and the layouts unlike it (tp8, no pipeline) much less:
    the miss is not one factor every candidate shares."""
    from autotune.search.prior import Prior, layout_of
    from autotune.spec.model_yaml import load_spec
    from autotune.spec.space import build_space

    path, _ = write_study(tmp_path, 0)
    spec = load_spec(path)
    prior = Prior(spec, build_space(spec), 0)
    measured = next(
        c
        for c in prior.candidates
        if layout_of(c) == (32, 1, 2, 16) and c.recompute == "selective" and c.fusion_mb == 256
    )
    before, _ = prior.belief.predict()
    step_ms = math.exp(before[prior.index[measured]]) * 1000 / 0.74
    prior.mark(measured, "ok")
    prior.next([(measured, 20_000.0, step_ms)])
    after, _ = prior.belief.predict()
    moved = after - before  # log step time: up is slower

    def shift(test):
        return float(np.median([moved[i] for i, c in enumerate(prior.candidates) if test(c)]))

    variants = shift(lambda c: layout_of(c) == (32, 1, 2, 16) and c != measured)
    alike = shift(lambda c: layout_of(c) in ((32, 1, 2, 8), (16, 1, 4, 32)))
    unlike = shift(lambda c: c.tp == 8 and c.pp == 1)
    missed = math.log(1 / 0.74)
    assert variants > 0.85 * missed  # where it was measured, the miss stays
    assert variants >= alike > 0.85 * variants  # the pipelined layouts share most of it
    assert unlike < 0.75 * variants  # tp8 without a pipeline: much less


def test_a_variant_of_a_measured_split_waits_for_unmeasured_mechanisms_then_the_band():
    """The acquisition's choice stands unless it merely polishes a split that ran; then a
    candidate of a mechanism nothing measured uses (within the wide band) runs instead, else the
    band's best."""
    from autotune.search.acquisition import before_the_choice

    score = np.array([0.9, 0.5, 0.4, 0.3])
    band = np.array([False, False, True, True])
    wide = np.array([False, True, True, True])
    # mechanisms: A, B; candidate 0 measured uses A; 1 uses B (unmeasured); 2, 3 use A
    uses = np.array([[True, False], [False, True], [True, False], [True, False]])
    measured = np.array([0])
    assert before_the_choice(score, band, wide, uses, measured, False) is None
    assert before_the_choice(score, band, wide, uses, measured, True) == 1
    covered = np.array([[True, False], [True, False], [True, False], [True, False]])
    assert before_the_choice(score, band, wide, covered, measured, True) == 2
    nothing = np.zeros(4, dtype=bool)
    assert before_the_choice(score, nothing, nothing, uses, measured, True) is None
