"""ep and cp in the export: mindformers.yaml states them as MindFormers' MoE configs do, and
strategy.ckpt refuses them until it lays experts and sequence splits out."""

from autotune.export.configs import export_reasons
from autotune.mindformers.config import overlay
from tests.costmodel.test_moe import DENSE, QWEN3_30B_A3B, candidate, spec_of


def test_mindformers_yaml_states_expert_and_context_parallel():
    spec = spec_of(QWEN3_30B_A3B)
    doc = overlay(spec, candidate(spec, ep=8))
    assert doc["parallel_config"]["expert_parallel"] == 8
    assert doc["parallel_config"]["context_parallel"] == 1
    assert doc["parallel"]["enable_alltoall"] is True
    assert overlay(spec, candidate(spec, ep=1))["parallel"]["enable_alltoall"] is False
    dense = spec_of(DENSE, flash_attention=True, seq_length=32768)
    doc = overlay(dense, candidate(dense, dp=16, cp=4))
    assert doc["parallel_config"]["context_parallel"] == 4
    assert "expert_parallel" not in doc["parallel_config"]  # a dense config never had it


def test_the_strategy_export_refuses_ep_and_cp_for_now():
    spec = spec_of(QWEN3_30B_A3B)
    assert export_reasons(spec, candidate(spec, ep=1)) == []
    (reason,) = export_reasons(spec, candidate(spec, ep=8))
    assert reason.startswith("ep = 8: strategy.ckpt")
