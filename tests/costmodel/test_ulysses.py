"""The knob ``ulysses``: of the cp ranks, those that split the attention heads (DeepSpeed-Ulysses)
— constrained as MindFormers checks it, searched only where cp is, priced as its all-to-alls,
written into mindformers.yaml as MindFormers 1.9 reads it (legacy and mcore), and read back by
init from a config that sets it."""

import json

import pytest

from autotune.costmodel import PROFILES
from autotune.costmodel.moe_time import all_to_all, ring_hops
from autotune.mindformers.config import document, overlay
from autotune.spec.constraints import violations
from autotune.spec.mindformers_context import ulysses_degree
from autotune.spec.space import build_space
from autotune.train.config import ConfigError
from autotune.train.config_check import check_config
from tests.conftest import make_config
from tests.costmodel.test_moe import DENSE, candidate, parts, spec_of
from tests.spec.test_mindformers_init import _variant, init, spec_and_space

LONG = {**DENSE, "flash_attention": True, "seq_length": 32768}  # 32 heads, 4 key/value heads


def test_ulysses_is_refused_as_mindformers_refuses_it():
    spec = spec_of(LONG)
    ok = candidate(spec, dp=16, cp=4, ulysses=4)
    assert violations(spec, ok) == []
    assert violations(spec, ok.replace(dp=16, cp=4, ulysses=2)) == []
    wide = violations(spec, ok.replace(dp=8, cp=8, ulysses=8))
    assert wide == [
        "tp·ulysses = 8 does not divide model.num_kv_heads = 4 (MindFormers splits the heads "
        "over them)"
    ]
    assert "ulysses = 4 does not divide cp = 2" in violations(spec, ok.replace(dp=32, cp=2))
    # tp takes its share of the heads first: tp 2 leaves 2 key/value heads a rank
    assert violations(spec, candidate(spec, dp=8, tp=2, cp=4, ulysses=2)) == []
    assert violations(spec, candidate(spec, dp=8, tp=2, cp=4, ulysses=4))


def test_ulysses_acts_only_with_cp_and_is_searched_only_where_cp_is():
    long = build_space(spec_of(LONG))
    assert long.domains["cp"] == (1, 2, 4, 8) and long.domains["ulysses"] == (1, 2, 4, 8)
    pairs = {(c.cp, c.ulysses) for c in long.candidates()}
    assert {(2, 2), (4, 2), (4, 4), (8, 2)} <= pairs
    assert {u for cp, u in pairs if cp == 1} == {1}  # no group without cp: one candidate
    assert candidate(spec_of(LONG), dp=64, cp=1, ulysses=4).canonical().ulysses == 1
    short = build_space(spec_of({**DENSE, "flash_attention": True}))  # 4,096 tokens: no cp
    assert short.domains["cp"] == (1,) and short.domains["ulysses"] == (1,)
    assert not [n for n in short.notes if n.startswith("ulysses")]  # quietly: the default


def test_ulysses_trades_the_ring_for_all_to_alls_inside_its_group():
    spec = spec_of(LONG, batch=64)
    profile = PROFILES["ascend-910b"]
    _, ring, memory = parts(spec, dp=16, cp=4)
    _, heads, same = parts(spec, dp=16, cp=4, ulysses=4)
    _, hybrid, _ = parts(spec, dp=16, cp=4, ulysses=2)
    assert same == memory  # the sequence is split as before
    # per layer, forward and backward each move a rank's queries, keys and values (32 query and
    # 2·4 key/value heads of 128) and then the output (32 heads) all-to-all over its group;
    # 4 samples a micro-batch, bf16, split over the 4 cp ranks, 48 layers, no recompute
    seq, layers, samples = 32768, 48, 4
    qkv, out = seq * (4096 + 2 * 512) * 2, seq * 4096 * 2

    def exchange(group: int) -> float:
        return sum(sum(all_to_all(samples * size / 4, group, 8, profile)) for size in (qkv, out))

    assert heads["cp_comm"] == pytest.approx(layers * 2 * exchange(4))  # no ring left
    share = samples * 2 * seq * 512 * 2 / 4  # a rank's keys and values
    around = layers * 3 * ring_hops(share, 1, profile.group_gbps(2), profile)  # over 4 / 2 ranks
    assert hybrid["cp_comm"] == pytest.approx(around + layers * 2 * exchange(2))
    assert ring["cp_comm"] == pytest.approx(
        layers * 3 * ring_hops(share, 3, profile.group_gbps(2), profile)
    )


@pytest.mark.parametrize("degree, algo", [(4, "ulysses_cp"), (2, "hybrid_cp")])
def test_mindformers_yaml_sets_the_group_as_mindformers_reads_it(degree, algo):
    spec = spec_of(LONG)
    c = candidate(spec, dp=16, cp=4, ulysses=degree)
    legacy = overlay(spec, c)
    assert legacy["parallel_config"]["context_parallel_algo"] == algo
    assert legacy["parallel_config"]["ulysses_degree_in_cp"] == degree
    assert ulysses_degree(legacy, 4) == degree  # MindFormers' legacy get_ulysses_cp_num
    # without a base of known kind the overlay is mcore's (its converter refuses hybrid_cp);
    # the header says what a legacy base needs
    text, _ = document(spec, c, {"study": "s", "number": 3})
    if algo == "hybrid_cp":
        assert '#     parallel_config.context_parallel_algo: "hybrid_cp"' in text
        assert "context_parallel_algo: colossalai_cp" in text
    mcore = {**legacy, "use_legacy": False}
    mcore["parallel_config"] = dict(
        legacy["parallel_config"], context_parallel_algo="colossalai_cp"
    )
    assert ulysses_degree(mcore, 4) == degree  # its attention splits by the degree alone
    assert (
        overlay(spec, c.replace(ulysses=1))["parallel_config"].get("ulysses_degree_in_cp") is None
    )


def test_init_reads_the_group_as_the_baseline_and_the_trainer_refuses_it(tmp_path):
    config = _variant(
        tmp_path,
        "hybrid",
        "parallel_config:\n  data_parallel: 2\n  context_parallel: 4\n"
        "  context_parallel_algo: hybrid_cp\n  ulysses_degree_in_cp: 2\n",
    )
    code, written = init(tmp_path, config, "--total-steps", "10", "--backend", "simulate")
    assert code == 0 and written["baseline"]["cp"] == 4 and written["baseline"]["ulysses"] == 2
    spec, space = spec_and_space(tmp_path)
    assert space.baseline().ulysses == 2 and 2 in space.domains["ulysses"]
    assert violations(spec, space.baseline()) == []
    trial = make_config(tmp_path, model={"family": "llama"}, knobs={"dp": 2, "ulysses": 2})
    with pytest.raises(ConfigError, match="knobs.ulysses: 2: the trial program runs no context"):
        check_config(json.loads(trial.read_text()))
