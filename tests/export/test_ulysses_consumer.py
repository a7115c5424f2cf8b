"""MindFormers 1.9 reads the Ulysses group a trial's mindformers.yaml sets (slow tier): over a
legacy llama base its ``get_ulysses_cp_num`` is the knob's value, and the form an mcore base
gets passes mcore's ``get_cp_comm_type`` with the degree the knob has."""

import pytest
import yaml

from autotune.mindformers.config import document
from autotune.spec.model_yaml import load_spec
from autotune.spec.space import build_space
from tests.export.test_mindformers_consumer import LLAMA2, consumer
from tests.spec.test_mindformers_init import init

pytestmark = pytest.mark.slow


def test_mindformers_splits_the_heads_as_the_knob_says(tmp_path):
    base = tmp_path / "base.yaml"  # Llama 2 7B with 4 cp ranks over 8 devices
    base.write_text(
        f"base_config: {LLAMA2}\nparallel_config:\n  data_parallel: 2\n  context_parallel: 4\n"
    )
    assert init(tmp_path, base, "--total-steps", "10", "--backend", "simulate")[0] == 0
    spec = load_spec(tmp_path / "model.yaml")
    baseline = build_space(spec).baseline()
    jobs, expected = [], []
    for degree in (1, 2, 4):
        c = baseline.replace(ulysses=degree)
        text, _ = document(spec, c, {"study": "s", "number": degree}, str(base))
        legacy = tmp_path / f"legacy{degree}.yaml"
        legacy.write_text(text)
        # what an mcore base gets (no base of known kind: the overlay's form), on the same run
        overlay = yaml.safe_load(document(spec, c, {"study": "s", "number": degree})[0])
        mcore = yaml.safe_load(text) | {"parallel_config": overlay["parallel_config"]}
        (tmp_path / f"mcore{degree}.yaml").write_text(yaml.safe_dump(mcore))
        jobs += [{"ulysses": str(legacy)}, {"ulysses": str(tmp_path / f"mcore{degree}.yaml")}]
        expected += [degree, degree]
    results = consumer(tmp_path, jobs)
    legacy_said = [r["legacy"] for r in results[0::2]]
    mcore_said = [r["mcore"] for r in results[1::2]]
    assert legacy_said == [1, 2, 4] and mcore_said == [1, 2, 4], results
