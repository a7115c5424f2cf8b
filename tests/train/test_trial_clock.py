"""A trial's timeout is the trial's, wherever it runs: its clock starts when a rank starts the
candidate, not when the launcher hands it over — a pool's first trial and a trial in processes
of its own no longer spend their budget on the workers' start-up (imports, the cluster join)
that a later trial of a warm pool does not pay. A start-up that never ends is stopped as the
infrastructure's failure. Real one-process trials whose start-up is made slow the way a slow
import is: a ``sitecustomize`` on the workers' PYTHONPATH that sleeps."""

from pathlib import Path

import pytest

from autotune.execution import runner
from autotune.execution.runner import run_trial
from autotune.execution.warm import WarmPool
from tests.conftest import make_config

pytestmark = pytest.mark.slow

START_UP_S = 15.0  # the workers' start-up, made slow
TIMEOUT_S = 12.0  # ... longer than the trial itself takes, shorter than both together


def _slow_start(tmp_path: Path, seconds: float) -> dict:
    folder = tmp_path / "slow-start"
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(f"import time\ntime.sleep({seconds})\n")
    return {"PYTHONPATH": str(folder)}


def _config(tmp_path: Path, name: str) -> dict:
    import json

    out = tmp_path / name
    # float32: the underflow probe never runs; 4 steps of a one-layer model take a few seconds
    return json.loads(make_config(out, model={"dtype": "float32"}, steps=4).read_text())


def test_the_timeout_starts_when_the_candidate_starts_fresh_or_first_in_a_pool(tmp_path):
    env = _slow_start(tmp_path, START_UP_S)
    fresh = run_trial(_config(tmp_path, "fresh"), tmp_path / "fresh", TIMEOUT_S, None, 1, env=env)
    assert fresh.outcome == "ok", fresh.detail[-2000:]
    assert fresh.run_s > START_UP_S  # it did pay the start-up, outside its budget
    pool = WarmPool(tmp_path / "pool", 1, env)
    try:
        first = pool.run(_config(tmp_path, "first"), tmp_path / "first", TIMEOUT_S, None)
        assert first.outcome == "ok", first.detail[-2000:]
        assert first.run_s > START_UP_S
    finally:
        pool.close()


def test_a_start_up_that_does_not_end_is_the_infrastructures(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "LAUNCH_LIMIT_S", 5.0)
    env = _slow_start(tmp_path, 600.0)
    result = run_trial(_config(tmp_path, "hung"), tmp_path / "hung", 3.0, None, 1, env=env)
    assert result.outcome == "error" and result.infrastructure, result
    assert "did not start the candidate within 5 s" in result.detail
    assert result.run_s < 5.0 + 10.0
