"""mindformers.yaml's CPU form: when MindFormers runs a study's config on this CPU, and how.

Contract: :func:`on_cpu` is whether a candidate's mindformers.yaml is the CPU form — the run
backend has one (``mindformers_cpu_form``: ``cpu``) and MindFormers runs the candidate there
(`autotune.spec.mindformers_trial.cpu_refusals` is empty). :func:`for_cpu` turns an overlay into
that form (docs/mindformers.md, "On CPU"): accumulation folded into the per-rank batch, no sink
mode, the legacy llama's CPU kernels, and autotune's CPU training step (:data:`CPU_WRAPPER_FILE`,
copied beside the file and registered through ``runner_wrapper.auto_register``).
:func:`device_notes` is the header's lines on how MindFormers runs the file where it differs by
device: the CPU form's, or why MindFormers refuses the candidate on CPU.
"""

from __future__ import annotations

from pathlib import Path

from autotune.mindformers.run_settings import run_backend
from autotune.spec.candidate import Candidate
from autotune.spec.mindformers_trial import cpu_refusals
from autotune.spec.specs import Spec

# autotune's training step for MindFormers on CPU, copied beside a CPU export's mindformers.yaml
# (the file's own name) and registered through runner_wrapper.auto_register.
CPU_WRAPPER_FILE = "mindformers_cpu_wrapper.py"
CPU_WRAPPER = "CpuTrainOneStepCell"


def on_cpu(spec: Spec, c: Candidate) -> bool:
    """Whether mindformers.yaml is the CPU form (MindFormers runs ``c`` on this CPU)."""
    return run_backend(spec).mindformers_cpu_form and not cpu_refusals(c)


def for_cpu(document: dict, c: Candidate) -> None:
    """The CPU form (docs/mindformers.md, "On CPU"): MindFormers accumulates gradients only under
    semi-auto parallel, so the K accumulated micro-batches become one K-fold batch per rank (the
    same global batch and updates, more activation memory)."""
    runner = document["runner_config"]
    runner.update(
        batch_size=runner["batch_size"] * runner["gradient_accumulation_steps"],
        gradient_accumulation_steps=1,
        sink_mode=False,
    )  # sink: steps × sink_size
    document["runner_wrapper"].update(
        type=CPU_WRAPPER, auto_register=f"{Path(CPU_WRAPPER_FILE).stem}.{CPU_WRAPPER}"
    )
    # no RmsNorm or fused attention kernel on CPU; rope without slicing fails to broadcast
    document["model"]["model_config"].update(
        use_rope_slice=True, fused_rms_norm=False, use_flash_attention=False
    )


def device_notes(spec: Spec, c: Candidate) -> str:
    """Header lines on how MindFormers runs this file where it differs by device."""
    if on_cpu(spec, c):
        return (
            "# On CPU: data parallel, accumulation folded into the per-rank batch, and autotune's\n"
            f"# {CPU_WRAPPER} ({CPU_WRAPPER_FILE} beside this file), which launch.sh\n"
            "# --mindformers registers through run_mindformer.py --register_path.\n"
        )
    if run_backend(spec).mindformers_cpu_form:
        return (
            "# MindFormers cannot run this on CPU: "
            + "; ".join(cpu_refusals(c))
            + ".\n# It is the config for Ascend; launch.sh --mindformers refuses it here.\n"
        )
    return ""
