"""model.yaml's experts, latent attention and multi-token prediction (the llama family's options
for MindFormers' Qwen3-MoE and DeepSeek-V3; `autotune.families.moe` lays them out).

Contract: :func:`parse_experts` reads those fields of a ``model`` section (a model_yaml
``_Section``) and returns them as ModelSpec keyword arguments, or fails naming the field: a
field of a family that does not take it; experts without their top-k or width, a top-k
outside 1 … num_experts, dense layers that leave no MoE layer, a capacity factor ≤ 0; the
expert fields without ``num_experts``; latent attention without its head widths, or beside
``head_dim``, ``qk_norm`` or grouped key/value heads (its heads are given by its own widths,
its norms are the latents'); a negative MTP count, a node limit below 1; a pipeline
interleave below 1 or beside DualPipe (which has no chunks).
"""

from __future__ import annotations

from autotune.families import owners
from autotune.families.moe import FIELDS

# ModelSpec's values of these fields where a model has none (`autotune.spec.specs.ModelSpec`)
NONE = {
    "num_experts": None,
    "experts_per_token": None,
    "moe_ffn_hidden_size": None,
    "shared_ffn_hidden_size": None,
    "dense_layers": 0,
    "moe_capacity_factor": None,
    "experts_tensor_parallel": False,
    "q_lora_rank": None,
    "kv_lora_rank": None,
    "qk_nope_head_dim": None,
    "qk_rope_head_dim": None,
    "v_head_dim": None,
    "mtp_layers": 0,
    "fp8_linear": False,
    "moe_comm_overlap": False,
    "moe_node_limit": None,
    "pipeline_schedule": None,
    "pipeline_interleave": None,
    "fsdp": False,
}
# what num_experts needs or allows
EXPERT_FIELDS = (*FIELDS[1:7], "moe_comm_overlap", "moe_node_limit")
MLA_WIDTHS = ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")


def parse_experts(s, family: str | None, num_layers: int | None) -> dict:
    """The fields of :data:`NONE` read from section ``s`` (see the module doc)."""
    values = {
        "num_experts": s.get("num_experts", int, minimum=2, default=None),
        "experts_per_token": s.get("experts_per_token", int, minimum=1, default=None),
        "moe_ffn_hidden_size": s.get("moe_ffn_hidden_size", int, minimum=1, default=None),
        "shared_ffn_hidden_size": s.get("shared_ffn_hidden_size", int, minimum=1, default=None),
        "dense_layers": s.get("dense_layers", int, minimum=0, default=0),
        "moe_capacity_factor": s.get("moe_capacity_factor", float, default=None),
        "experts_tensor_parallel": s.get("experts_tensor_parallel", bool, default=False),
        "q_lora_rank": s.get("q_lora_rank", int, minimum=1, default=None),
        "kv_lora_rank": s.get("kv_lora_rank", int, minimum=1, default=None),
        **{name: s.get(name, int, minimum=1, default=None) for name in MLA_WIDTHS},
        "mtp_layers": s.get("mtp_layers", int, minimum=0, default=0),
        "fp8_linear": s.get("fp8_linear", bool, default=False),
        "moe_comm_overlap": s.get("moe_comm_overlap", bool, default=False),
        "moe_node_limit": s.get("moe_node_limit", int, minimum=1, default=None),
        "pipeline_schedule": s.get(
            "pipeline_schedule", str, choices=("1f1b", "dualpipe"), default=None
        ),
        "pipeline_interleave": s.get("pipeline_interleave", int, minimum=1, default=None),
        "fsdp": s.get("fsdp", bool, default=False),
    }
    for name, value in values.items():
        if value != NONE[name] and family not in owners(name):
            names = " or ".join(owners(name)) or "no"
            s.fail(name, f"is the {names} family's option (model.family: {names})")
    if values["pipeline_interleave"] not in (None, 1) and values["pipeline_schedule"] == "dualpipe":
        s.fail(
            "pipeline_interleave",
            "not with pipeline_schedule: dualpipe (its ranks run two stages, not chunks)",
        )
    _check_experts(s, values, num_layers)
    _check_latent(s, values)
    return values


def _check_experts(s, v: dict, num_layers: int | None) -> None:
    experts = v["num_experts"]
    if experts is None:
        for name in EXPERT_FIELDS:
            if v[name] != NONE[name]:
                s.fail(name, "describes experts: give model.num_experts too")
        return
    for name in ("experts_per_token", "moe_ffn_hidden_size"):
        if v[name] is None:
            s.fail(name, f"is required with model.num_experts ({experts} experts)")
    if v["experts_per_token"] > experts:
        s.fail("experts_per_token", f"{v['experts_per_token']} > model.num_experts = {experts}")
    if num_layers is not None and v["dense_layers"] >= num_layers:
        s.fail(
            "dense_layers",
            f"{v['dense_layers']} leaves no MoE layer of the model's {num_layers}",
        )
    capacity = v["moe_capacity_factor"]
    if capacity is not None and capacity <= 0:
        s.fail("moe_capacity_factor", f"must be > 0 (or left out: dropless), got {capacity}")


def _check_latent(s, v: dict) -> None:
    if v["kv_lora_rank"] is None:
        for name in ("q_lora_rank", *MLA_WIDTHS):
            if v[name] is not None:
                s.fail(name, "describes multi-latent attention: give model.kv_lora_rank too")
        return
    for name in MLA_WIDTHS:
        if v[name] is None:
            s.fail(name, "is required with model.kv_lora_rank (multi-latent attention)")
    for name, why in (
        ("head_dim", "its heads' widths are qk_nope_head_dim, qk_rope_head_dim and v_head_dim"),
        ("qk_norm", "its norms are the latents' (q_a_norm, kv_a_norm), always there"),
    ):
        if s.data.get(name) not in (None, False):
            s.fail(name, f"not with multi-latent attention: {why}")
    kv, heads = s.data.get("num_kv_heads"), s.data.get("num_heads")
    if kv is not None and kv != heads:
        s.fail(
            "num_kv_heads",
            f"{kv}: multi-latent attention gives every one of the {heads} heads its own key "
            "and value",
        )
