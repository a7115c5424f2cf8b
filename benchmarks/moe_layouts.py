"""Table 5 of ``benchmarks/costmodel_validation.py``: the cost model against one published source
that gives several layouts of one mixture-of-experts model on one system — their speeds, their
memory verdicts and their ranking (run by hand; prints a table).

    PYTHONPATH=. .venv/bin/python benchmarks/moe_layouts.py

Source: NVIDIA's Megatron MoE Model Zoo (github.com/yanring/Megatron-MoE-ModelZoo),
``best_practice/Qwen3/readme.md`` at c1ad0b5c, "Performance Results": Qwen3-235B-A22B
pre-training on 256 H100 (NVLink 4, InfiniBand 8 × 50 GB/s per node), sequence 4,096, global
batch 2,048, BF16, Megatron-Core, five layouts with their step times; the model and run flags
from ``model_configs/benchmarking/Qwen3-235B-A22B.yaml`` at 1ed4179f (94 layers, hidden 4,096,
64 heads of 128 in 4 query groups, q/k norms, 128 experts of 1,536, 8 per token, vocabulary
151,936 (``--make-vocab-size-divisible-by 1187``), untied head; the distributed optimizer,
sequence parallelism, flash attention, grouped GEMM). Each row's dispatcher, tp, pp, ep, dp,
micro-batch, recompute modules and virtual pipeline as the table gives them. The metric is
tokens per second per GPU, 2,048 × 4,096 / 256 / step time; target ±20 %, every layout ran (its
memory fits 80 GB), and the estimates should order the layouts as their step times do. The
Hopper profiles' ``achievable`` fraction is fitted on these five rows (the script prints the fit
beside the constant in use); Table 4's DeepSeek-V3 row, on H800, is held out.

How a row's settings are priced, and what is not (printed per row):
- DeepEP (``--moe-enable-deepep``): its internode kernels send a token once to each node that
  holds one of its experts and forward it there over NVLink as it arrives — the node-limited
  dispatch with every node of the ep group allowed (``moe_node_limit`` = the group's nodes). A2A
  (``--moe-token-dispatcher-type alltoall``): each copy travels on its own.
- "+1f1b overlap" (``--overlap-moe-expert-parallel-comm``): ``moe_comm_overlap``.
- recompute "norm, act" (``--recompute-modules layernorm moe_act``): the knob's ``selective``
  with ``model.recompute_modules`` [layernorm, moe_act]. "full": the knob's ``full``.
- ``--sequence-parallel``: ``model.sequence_parallel`` (the ``megatron`` engine's: the norms on
  a tp share of the tokens, each linear layer's input kept as its shard and gathered again).
- VPP (``--num-virtual-stages-per-pipeline-rank``, interleaved 1F1B):
  ``model.pipeline_interleave``.
- FSDP (Megatron's ``--use-megatron-fsdp``: parameters, gradients and states sharded, gathered
  per layer): ``model.fsdp``.
"""

from __future__ import annotations

import math

from moe_validation import simulate_spec  # benchmarks/moe_validation.py

from autotune.costmodel import PROFILES, estimate
from autotune.spec.candidate import Candidate

TOLERANCE = 0.20
GPUS, BATCH, SEQ, PER_NODE = 256, 2048, 4096, 8
QWEN3_235B = {
    "family": "llama",
    "num_layers": 94,
    "hidden_size": 4096,
    "num_heads": 64,
    "num_kv_heads": 4,
    "head_dim": 128,
    "qk_norm": True,
    "ffn_hidden_size": 12288,
    "num_experts": 128,
    "experts_per_token": 8,
    "moe_ffn_hidden_size": 1536,
    "vocab_size": 151936,
    "seq_length": SEQ,
    "dtype": "bfloat16",
    "flash_attention": True,
    "sequence_parallel": True,  # --sequence-parallel
}
# label, dispatcher, (tp, pp, ep, dp, micro-batch size), recompute, vpp, fsdp, overlap, step s
ROWS = [
    ("DeepEP", "deepep", (2, 8, 32, 16, 1), "selective", 4, False, False, 19.7),
    ("DeepEP +overlap", "deepep", (2, 8, 32, 16, 1), "selective", 4, False, True, 17.6),
    ("DeepEP FSDP", "deepep", (2, 1, 8, 128, 4), "full", 1, True, False, 17.6),
    ("A2A", "alltoall", (2, 32, 8, 4, 1), "selective", 3, False, False, 24.2),
    ("DeepEP tp4", "deepep", (4, 8, 8, 8, 1), "none", 4, False, False, 29.0),
]


def _priced(dispatcher, tp, pp, ep, dp, micro, recompute, vpp, fsdp, overlap, device="h100-80g"):
    """(spec, candidate) of one row, as the module doc says it is priced; ``device`` the
    ``cluster.device`` (a profile's name, or a mapping over one)."""
    model = dict(QWEN3_235B)
    if dispatcher == "deepep":
        model["moe_node_limit"] = max(1, ep // PER_NODE)  # every node of the group allowed
    if overlap:
        model["moe_comm_overlap"] = True
    if vpp > 1:
        model["pipeline_interleave"] = vpp
    if fsdp:
        model["fsdp"] = True
    if recompute == "selective":  # --recompute-modules layernorm moe_act
        model["recompute_modules"] = ["layernorm", "moe_act"]
    steps = BATCH // (dp * micro)  # micro-batches per step, each of ``micro`` samples
    c = Candidate(
        dp=dp,
        tp=tp,
        pp=pp,
        micro_batches=steps if pp > 1 else 1,
        fusion_mb=64,
        grad_accum=1 if pp > 1 else steps,
        loss_scale=2**16,
        warmup_steps=0,
        jit_level="O1",
        recompute=recompute,
        parallel_optimizer=True,  # --use-distributed-optimizer
        ep=ep,
        cp=1,
    )
    return simulate_spec(model, BATCH, GPUS, device), c


def rows(device="h100-80g") -> list[dict]:
    out = []
    for label, dispatcher, layout, recompute, vpp, fsdp, overlap, step in ROWS:
        tp, pp, ep, dp, micro = layout
        spec, c = _priced(dispatcher, tp, pp, ep, dp, micro, recompute, vpp, fsdp, overlap, device)
        est = estimate(spec, c, engine="megatron", refuse=False)
        reported = BATCH * SEQ / GPUS / step
        tokens = est.samples_per_s * SEQ / GPUS
        parts = est.breakdown["time_s"]
        top = sorted(parts, key=parts.get, reverse=True)[:3]
        out.append(
            {
                "label": label,
                "layout": f"tp{tp} pp{pp} ep{ep} dp{dp} mbs{micro} {recompute[:4]}",
                "reported": reported,
                "estimate": tokens,
                "error": tokens / reported - 1,
                "memory_gb": est.memory_gb_per_device,
                "fits": est.memory_gb_per_device <= PROFILES["h100-80g"].memory_gb,
                "largest": ", ".join(f"{p} {parts[p] / est.step_time_s:.0%}" for p in top),
            }
        )
    return out


def fit_achievable() -> float:
    """Least squares in log space of every row's error over the H100's achievable fraction
    (the Hopper profiles' constant is fitted on all five rows)."""
    best = (math.inf, None)
    for k in range(30, 96):
        device = {"base": "h100-80g", "achievable": k / 100}
        err = sum(math.log(1 + r["error"]) ** 2 for r in rows(device))
        best = min(best, (err, k / 100))
    return best[1]


def ranking(found: list[dict]) -> tuple[int, int]:
    """(pairs the estimates order as the step times do, pairs with different step times)."""
    agree = total = 0
    for i, a in enumerate(found):
        for b in found[i + 1 :]:
            if a["reported"] == b["reported"]:
                continue
            total += 1
            agree += (a["reported"] > b["reported"]) == (a["estimate"] > b["estimate"])
    return agree, total


def table() -> None:
    print(
        "Table 5: Megatron MoE Model Zoo, Qwen3-235B-A22B on 256 H100 (engine megatron, "
        f"achievable = {PROFILES['h100-80g'].achievable}; best fit on these rows = "
        f"{fit_achievable()}), tokens/s per GPU; every layout ran, so each fits 80 GB (target "
        f"±{TOLERANCE:.0%})"
    )
    head = (
        f"{'row':<17}{'layout':<33}{'reported':>9}{'estimate':>9}{'error':>8}{'mem GB':>8}  "
        f"{'verdict':<13}largest parts"
    )
    print(head)
    print("-" * len(head))
    found, misses = rows(), 0
    for r in found:
        miss = abs(r["error"]) > TOLERANCE or not r["fits"]
        misses += miss
        print(
            f"{r['label']:<17}{r['layout']:<33}{r['reported']:>9.0f}{r['estimate']:>9.0f}"
            f"{r['error']:>+8.1%}{r['memory_gb']:>8.1f}  "
            f"{'fits' if r['fits'] else 'DOES NOT FIT':<13}{r['largest']}" + (" !" if miss else "")
        )
    agree, total = ranking(found)
    print(f"{misses} of {len(found)} rows miss (error beyond ±{TOLERANCE:.0%} or memory verdict)")
    print(
        f"ranking: the estimates order {agree} of {total} pairs of layouts as their step times do"
    )
    order = sorted(found, key=lambda r: -r["reported"])
    print("published, fastest first: " + " > ".join(r["label"] for r in order))
    order = sorted(found, key=lambda r: -r["estimate"])
    print("estimated, fastest first: " + " > ".join(r["label"] for r in order))


if __name__ == "__main__":
    table()
