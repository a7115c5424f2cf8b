"""What an Ascend MindFormers trial measures, on constructed recorder files and configs (issue 44):
the loss as MindFormers' own monitor computes it, from the rank it names; one step per step
under sink mode; one memory formula with autotune's trainer and the study's cap as MindFormers'
``max_device_memory``. MindFormers' rules are its 1.9.0 source (docs/mindformers.md, "On a
device")."""

import json

import pytest
import yaml

from autotune.mindformers.results import write_metrics
from autotune.mindformers.trial import RUN_KEYS, trial_document, trial_section
from autotune.spec.candidate import Candidate
from autotune.spec.model_yaml import load_spec
from autotune.spec.space import build_space
from tests.mindformers.conftest import TINY, mindformers_model

ASCEND = {
    "cluster.backend": "ascend",
    "cluster.device": "ascend-910b",
    "cluster.devices": 4,
    "baseline.dp": 4,
}
NPU_SMI = (  # npu-smi info's process table, as tests/execution/test_accelerators.py has it
    "| NPU     Chip              | Process id    | Process name             | Process memory(MB)      |\n"
    "| 0       0                 | {pid}          | python                   | {mb}                   |\n"
)


def _config(ranks, loss_rank=None, divisor=1, backend="cpu", steps=4):
    return {
        "backend": backend,
        "train": {"global_batch_size": 8, "total_steps": 1000},
        "trial": {"steps": steps, "measure_after": 1},
        "mindformers": {
            "ranks": ranks,
            "loss_rank": loss_rank,
            "loss_divisor": divisor,
            "loss_scaled": False,
            "initial_scale": 1.0,
        },
    }


def _trial(folder, losses_by_rank, summary=None):
    """A trial folder as the recorder leaves it: per rank its steps and its summary."""
    folder.mkdir(parents=True, exist_ok=True)
    for rank, losses in losses_by_rank.items():
        steps = [
            {
                "step": i,
                "step_time_ms": 100.0 + i,
                "loss": loss,
                "overflow": False,
                "loss_scale": 1.0,
                "ended_at": 1000.0 + i,
            }
            for i, loss in enumerate(losses)
        ]
        (folder / f"steps.rank{rank}.jsonl").write_text(
            "".join(json.dumps(s) + "\n" for s in steps)
        )
        (folder / f"metrics.rank{rank}.json").write_text(
            json.dumps(
                {
                    "rank": rank,
                    "records": len(steps),
                    "started_at": 990.0,
                    "train_begin_at": 995.0,
                    "finished_at": 1010.0,
                    "peak_rss_mb": 900.0,
                    "pid": 4000 + rank,
                    **(summary(rank) if summary else {}),
                }
            )
        )
    return folder


@pytest.fixture(scope="module")
def ascend(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ascend")
    spec = load_spec(mindformers_model(folder, **ASCEND, **{"trial.steps": 6}))
    return spec, build_space(spec).baseline()


# 1. The loss is a sum: divided as MindFormers' monitor divides it


def test_the_divisor_is_mindformers_monitors_for_the_counts_it_runs_with():
    from autotune.mindformers.loss import loss_divisor, loss_rank

    semi = {"parallel": {"parallel_mode": 1}}
    pipeline = {**semi, "parallel_config": {"pipeline_stage": 4, "micro_batch_num": 8}}
    assert loss_divisor(pipeline) == 8  # PipelineCell adds its 8 micro-batches' losses
    # ... and accumulation is reset to 1 under pipeline stages (_check_grad_accumulation_steps)
    assert loss_divisor({**pipeline, "runner_config": {"gradient_accumulation_steps": 4}}) == 8
    accumulate = {**semi, "runner_config": {"gradient_accumulation_steps": 4}}
    assert loss_divisor(accumulate) == 4  # GradAccumulationCell's sum
    assert loss_divisor({**accumulate, "micro_batch_interleave_num": 2}) == 8
    # per token: the cell divides by the tokens itself; the interleave is divided still
    per_token = {**pipeline, "calculate_per_token_loss": True, "micro_batch_interleave_num": 2}
    assert loss_divisor(per_token) == 2
    # data parallel (MindFormers resets accumulation to 1 there): each rank's own shard's loss
    data = {"parallel": {"parallel_mode": 0}, "runner_config": {"gradient_accumulation_steps": 4}}
    assert loss_divisor(data) == 1 and loss_rank(data, 2) is None
    # the rank MindFormers names: the last card's, rank 0's under zero_bubble_v
    assert loss_rank(pipeline, 16) == 15
    zbv = {
        "parallel": {"parallel_mode": 1, "pipeline_config": {"pipeline_scheduler": "zero_bubble_v"}}
    }
    assert loss_rank(zbv, 16) == 0


def test_a_pipeline_candidates_section_names_the_last_rank_and_its_micro_batches(ascend, tmp_path):
    spec, baseline = ascend
    c = Candidate(**{**baseline.as_dict(), "dp": 1, "tp": 2, "pp": 2, "micro_batches": 4})
    mf = trial_section(spec, c, 1, tmp_path / "1")
    ran = yaml.safe_load(mf["trial_yaml"])
    assert ran["parallel_config"]["pipeline_stage"] == 2 and ran["parallel"]["parallel_mode"] == 1
    assert (mf["ranks"], mf["loss_rank"], mf["loss_divisor"]) == (4, 3, 4)


def test_a_pipeline_runs_recorded_sums_become_the_loss_mindformers_prints(tmp_path):
    """4 ranks, pp2 · tp2, 4 micro-batches: the last stage's cell returns the sum of its 4
    micro-batches' losses (≈ 4 × ln 128); stage 0's output is no loss at all."""
    sums = [19.41, 19.40, 19.38, 19.37]
    trial = _trial(tmp_path / "t", {0: [0.0] * 4, 1: [0.0] * 4, 2: sums, 3: sums})
    assert write_metrics(trial, _config(4, loss_rank=3, divisor=4))
    metrics = json.loads((trial / "metrics.json").read_text())
    assert metrics["loss_first"] == pytest.approx(sums[0] / 4)
    assert metrics["loss_last"] == pytest.approx(sum(sums) / 4 / 4)
    steps = [json.loads(line) for line in (trial / "steps.jsonl").read_text().splitlines()]
    assert [s["loss"] for s in steps] == pytest.approx([x / 4 for x in sums])


# 2. The loss of the stage MindFormers names, or a refusal in one line


def test_a_two_node_trial_without_the_last_ranks_files_is_refused_in_one_line(tmp_path):
    """pp2 over 2 nodes of 8 without a shared folder: node 0 sees ranks 0-7, all of stage 0."""
    from autotune.mindformers.results import MissingRanks

    trial = _trial(tmp_path / "t", {r: [0.0] * 4 for r in range(8)})
    with pytest.raises(MissingRanks) as refused:
        write_metrics(trial, _config(16, loss_rank=15, divisor=8))
    said = str(refused.value)
    assert "\n" not in said and "8, 9, 10, 11, 12, 13, 14, 15 of 16" in said
    assert "rank 15, whose loss MindFormers reports" in said and "--artifacts" in said
    assert not (trial / "metrics.json").exists()


# 3. A sink is not a step


def test_a_sink_mode_config_runs_one_step_per_callback(tmp_path):
    base = tmp_path / "sink.yaml"
    base.write_text(
        yaml.safe_dump(
            {"base_config": str(TINY), "runner_config": {"sink_mode": True, "sink_size": 4}}
        )
    )
    spec = load_spec(mindformers_model(tmp_path, base=base, **ASCEND))
    c = build_space(spec).baseline()
    text, changes = trial_document(spec, c, 0, tmp_path / "0")
    ran = yaml.safe_load(text)
    assert ran["runner_config"]["sink_mode"] is True and ran["runner_config"]["sink_size"] == 1
    assert ("runner_config.sink_size", 4, 1) in changes
    assert f"#   runner_config.sink_size: {RUN_KEYS['runner_config.sink_size']}" in text


# 6. One memory formula, and the study's cap as MindFormers' max_device_memory


def test_a_device_trials_peak_is_autotunes_trainers_formula(tmp_path):
    """Each rank: its tensors' allocated peak plus what the device holds outside the pool (the
    tool's reading less the pool's reserved size), the largest over the ranks."""
    from autotune.train.runtime.device_memory import overhead_mb, trial_peak_mb

    def device(rank):
        return {
            "device_allocated_mb": 20000.0 + rank,
            "device_reserved_mb": 22528.0,
            "device_reserved_now_mb": 22528.0,
            "device_smi": NPU_SMI.format(pid=4000 + rank, mb=25600 + 10 * rank),
        }

    trial = _trial(tmp_path / "t", {0: [4.8] * 4, 1: [4.8] * 4}, summary=device)
    assert write_metrics(trial, _config(2, backend="ascend"))
    peak = json.loads((trial / "metrics.json").read_text())["peak_memory_mb"]
    expected = [trial_peak_mb(20000.0 + r, overhead_mb(25600 + 10 * r, 22528.0)) for r in (0, 1)]
    assert peak == max(expected) == 20001.0 + 3072.0 + 10.0
    # a tool that did not list the process (a container): no overhead, said by its absence
    unseen = _trial(
        tmp_path / "u", {0: [4.8] * 4}, summary=lambda r: {**device(r), "device_smi": ""}
    )
    assert write_metrics(unseen, _config(1, backend="ascend"))
    assert json.loads((unseen / "metrics.json").read_text())["peak_memory_mb"] == 20000.0


def test_a_device_trial_runs_at_the_studys_cap_and_reads_the_vendor_tool(ascend, tmp_path):
    spec, baseline = ascend
    ran = yaml.safe_load(trial_document(spec, baseline, 0, tmp_path)[0])
    assert ran["context"]["max_device_memory"] == "57.60GB"  # 64 GB × 0.9, the screen's budget
    recorder = ran["callbacks"][-1]
    assert recorder["device_memory"] is True and recorder["memory_tool"] == ["npu-smi", "info"]
    capped = load_spec(
        mindformers_model(tmp_path, **ASCEND, **{"cluster.max_device_memory_gb": 58})
    )
    ran = yaml.safe_load(trial_document(capped, baseline, 0, tmp_path)[0])
    assert ran["context"]["max_device_memory"] == "58GB"  # the user's cap, the screen's too
