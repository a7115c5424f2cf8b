"""Candidates that would run alike are one candidate: knobs that cannot act on a candidate,
and warmups a trial cannot tell apart; a study created before keeps its own."""

import textwrap
from dataclasses import replace

import optuna

from autotune.search.proposer import Proposer
from autotune.spec.candidate import Candidate
from autotune.spec.model_yaml import load_spec
from autotune.spec.space import build_space
from autotune.study.opening import as_created, fingerprint

CPU = """
study: t
model: {family: transformer, num_layers: 2, hidden_size: 32, num_heads: 4, seq_length: 16,
        vocab_size: 64, dtype: float16}
train: {global_batch_size: 8}
cluster: {backend: cpu, devices: 2}
"""
WARMUPS = tuple(range(0, 2001, 100))


def spec_and_space(tmp_path):
    path = tmp_path / "model.yaml"
    path.write_text(textwrap.dedent(CPU))
    spec = load_spec(path)
    return spec, build_space(spec)


def test_fusion_and_the_parallel_optimizer_do_not_act_without_dp():
    tp2 = Candidate(
        dp=1,
        tp=2,
        pp=1,
        micro_batches=1,
        fusion_mb=1,
        grad_accum=1,
        loss_scale=1024,
        warmup_steps=0,
        jit_level="O1",
        recompute="none",
        parallel_optimizer=True,
    )
    assert tp2.canonical() == tp2.replace(fusion_mb=64, parallel_optimizer=False)
    dp2 = tp2.replace(dp=2, tp=1)
    assert dp2.canonical() == dp2


def test_a_stored_candidate_with_a_knob_that_could_not_act_answers_its_proposal(tmp_path):
    spec, space = spec_and_space(tmp_path)
    proposer = Proposer(spec, space, optuna.create_study())
    stored = Candidate(
        dp=1,
        tp=2,
        pp=1,
        micro_batches=1,
        fusion_mb=1,
        grad_accum=1,
        loss_scale=1024,
        warmup_steps=0,
        jit_level="O1",
        recompute="none",
    )
    proposer.remember(stored, 3, "ok", {"goodput": 1.0})
    assert proposer.seen[stored.replace(fusion_mb=64)][0] == 3


def test_a_study_created_before_warmups_were_merged_keeps_its_own(tmp_path):
    spec, space = spec_and_space(tmp_path)
    assert len(space.domains["warmup_steps"]) == 7
    old_space = replace(space, domains={**space.domains, "warmup_steps": WARMUPS})
    study = optuna.create_study()
    study.set_user_attr("fingerprint", fingerprint(spec, old_space))
    kept, notes = as_created(study, space)
    assert kept.domains["warmup_steps"] == WARMUPS
    assert fingerprint(spec, kept) == study.user_attrs["fingerprint"]  # it resumes
    assert any(note.startswith("warmup_steps: ") and "keeps its own" in note for note in notes)
