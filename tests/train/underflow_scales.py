"""Test program: the underflow bound beside the probe on the same weights, at several loss scales.

    [msrun …] tests/train/underflow_scales.py CONFIG_JSON SCALES_JSON

Runs the trial program's launch and engine (`autotune.train.program`, `autotune.train.step.engine`)
for CONFIG_JSON, then, for each scale of SCALES_JSON: one training step at that scale, the
weights put back as the step found them — so the probe after it sees the weights, batch and
scale the step's own bound counted — and `autotune.train.step.probe.measure` with the probe forced
(``trial.underflow_probe: always``), so both z and u are measured. Rank 0 writes
``[{scale, overflow, z, u}]`` to ``out_dir/scales.json``.
"""

import json
import os
import sys

import numpy as np


def main(config_path: str, scales_json: str) -> None:
    import mindspore as ms

    from autotune.spec.knobs import SCALE_WINDOW
    from autotune.train.parallel.groups import world_sum
    from autotune.train.runtime.session import open_session
    from autotune.train.step.engine import build_engine

    cfg = json.loads(open(config_path).read())
    cfg["trial"]["underflow_probe"] = "always"
    knobs = cfg["knobs"]
    placement = open_session(cfg, knobs["dp"] * knobs["tp"] * knobs["pp"], ms).place(knobs)
    engine = build_engine(cfg, placement, SCALE_WINDOW)
    inputs, labels = engine.dataset(0, placement.dp_index, placement.dp)

    def summed(values):
        return [float(v) for v in world_sum(values)] if placement.world > 1 else values

    rows = []
    for scale in json.loads(scales_json):
        engine.state.scale.set_data(ms.Tensor(np.float32(scale)))
        before = [(p, p.asnumpy().copy()) for p in engine.network.trainable_params()]
        _, overflow, _ = engine.step(inputs, labels)
        for param, value in before:
            param.set_data(ms.Tensor(value))
        metrics = engine.underflow(inputs, labels, float(np.float32(scale)), summed)
        rows.append(
            {
                "scale": scale,
                "overflow": bool(overflow),
                "z": metrics["underflow_bound"],
                "u": metrics["underflow_share"],
            }
        )
    if placement.rank == 0:
        with open(os.path.join(cfg["out_dir"], "scales.json"), "w") as f:
            json.dump(rows, f)


if __name__ == "__main__":
    if os.environ.get("MS_ROLE") == "MS_SCHED":  # msrun's scheduler: it only serves the cluster
        from autotune.train.runtime.device import serve_cluster

        sys.exit(serve_cluster())
    main(sys.argv[1], sys.argv[2])
