"""The parallel optimizer's shards as `autotune.layout` defines them (MindSpore's rules at its
default level: docs/parallel.md), worked out by hand."""

from autotune.layout import (
    OptimizerShard,
    ParamLayout,
    builtin_layout,
    optimizer_shard,
    optimizer_whole,
    with_optimizer_shards,
)


def lay(shape, split_dim=None):
    return ParamLayout("w", shape, 0, split_dim)


def test_a_tp_split_parameter_is_sharded_over_its_dp_group_striding_by_tp():
    # 512 × 128 float32 = 256 KB, column-split over tp 2: each rank's 256 rows over dp 4
    shard = optimizer_shard(lay((512, 128), split_dim=0), dp=4, tp=2, element_bytes=4)
    assert shard == OptimizerShard(size=4, step=2)
    row_split = optimizer_shard(lay((128, 512), split_dim=1), dp=4, tp=2, element_bytes=4)
    assert row_split == OptimizerShard(size=4, step=2)  # dim 0 of the slice, whatever was split


def test_a_replicated_parameter_is_sharded_over_all_dp_tp_ranks_of_its_stage():
    assert optimizer_shard(lay((512, 128)), dp=2, tp=2, element_bytes=4) == OptimizerShard(4, 1)
    assert optimizer_shard(lay((512, 128)), dp=2, tp=1, element_bytes=4) == OptimizerShard(2, 1)


def test_threshold_is_the_full_size_in_the_parameter_dtype_and_a_64_kb_parameter_is_sharded():
    # MindSpore's SplitParam skips `param_size < threshold` (opt_param_mgr.cc): 128 × 128 float32
    # is 64 KB exactly and is sharded; one row less stays whole
    assert optimizer_shard(lay((128, 128)), dp=2, tp=1, element_bytes=4) == OptimizerShard(2, 1)
    assert optimizer_shard(lay((126, 128)), dp=2, tp=1, element_bytes=4) is None
    # the same shape in float16 is 32 KB
    assert optimizer_shard(lay((128, 128)), dp=2, tp=1, element_bytes=2) is None
    assert (
        optimizer_shard(lay((128, 128)), dp=2, tp=1, element_bytes=2, threshold_kb=32) is not None
    )


def test_mindformers_llama_leaves_its_norms_and_by_default_its_token_table_whole():
    # LlamaRMSNorm's weight and LlamaEmbedding's table (unless model_config.parallel_optimizer)
    # are created with parallel_optimizer=False, which SplitParam skips
    model = {
        "family": "llama",
        "num_layers": 2,
        "hidden_size": 256,
        "num_heads": 4,
        "ffn_hidden_size": 512,
        "seq_length": 32,
        "vocab_size": 1024,
    }
    layouts, _ = builtin_layout(model, 1, 1)

    def sharded(cfg):
        marked = with_optimizer_shards(layouts, 2, 1, 4, whole=optimizer_whole(cfg))
        return {name for name, p in marked.items() if p.opt_shard}

    default = sharded(model)
    assert "model.tok_embeddings.embedding_weight" not in default
    assert "lm_head.weight" in default and "model.layers.0.feed_forward.w1.weight" in default
    assert "model.tok_embeddings.embedding_weight" in sharded(
        {**model, "embedding_parallel_optimizer": True}
    )
    # a norm as large as the threshold still stays whole (16384 float32 = 64 KB)
    norm = {"model.layers.0.attention_norm.weight": ParamLayout("n", (16384,), 0, None)}
    assert (
        with_optimizer_shards(norm, 2, 1, 4, whole=optimizer_whole(model))[
            "model.layers.0.attention_norm.weight"
        ].opt_shard
        is None
    )
    assert optimizer_whole({"family": "transformer"}) == ()  # autotune's own families: every weight


def test_no_shard_without_a_dp_group_or_an_even_split_of_dim_0():
    assert optimizer_shard(lay((1024, 128)), dp=1, tp=2, element_bytes=4) is None
    assert optimizer_shard(lay((1023, 128)), dp=2, tp=1, element_bytes=4) is None  # 1023 rows
    # column split 1024/2 = 512 rows per tp rank, 512 % 3 ≠ 0
    assert optimizer_shard(lay((1024, 128), split_dim=0), dp=3, tp=2, element_bytes=4) is None


def test_each_rank_owns_its_rows_in_mindspore_rank_order():
    split = with_optimizer_shards({"w": lay((512, 128), split_dim=0)}, dp=2, tp=2, element_bytes=4)[
        "w"
    ]
    # tp slice 256 rows; dp index d owns rows d·128 … of it, whatever its tp index
    assert [split.shard_rows(2, d, t) for d in range(2) for t in range(2)] == [
        slice(0, 128),
        slice(0, 128),
        slice(128, 256),
        slice(128, 256),
    ]
    assert split.rank_shape(2) == (128, 128)
    whole = with_optimizer_shards({"w": lay((512, 128))}, dp=2, tp=2, element_bytes=4)["w"]
    # replicated: the stage's rank dp_index·tp + tp_index owns the k-th quarter
    assert [whole.shard_rows(2, d, t) for d in range(2) for t in range(2)] == [
        slice(0, 128),
        slice(128, 256),
        slice(256, 384),
        slice(384, 512),
    ]
    assert whole.rank_shape(2) == (128, 128)


def test_a_pipeline_that_does_not_divide_the_layers_gives_its_first_stages_one_more():
    """DeepSeek-V3's 61 layers on 16 stages: 13 stages of 4, 3 of 3 — the split the trainer
    builds, the export writes (MindFormers' offsets) and the cost model prices."""
    from autotune.families.layers import stage_layers, stage_of, stage_offsets, stage_sizes

    sizes = stage_sizes(61, 16)
    assert sizes == [4] * 13 + [3] * 3 and sum(sizes) == 61
    assert stage_offsets(61, 16) == [1] * 13 + [0] * 3 and stage_offsets(48, 4) == 0
    covered = [i for s in range(16) for i in stage_layers(61, 16, s)]
    assert covered == list(range(61))
    assert all(stage_of(61, 16, i) == s for s in range(16) for i in stage_layers(61, 16, s))
    model = {
        "family": "transformer",
        "num_layers": 5,
        "hidden_size": 8,
        "num_heads": 2,
        "ffn_hidden_size": 32,
        "seq_length": 4,
        "vocab_size": 16,
    }
    layouts, reasons = builtin_layout(model, tp=1, pp=2)
    assert not reasons
    assert [layouts[f"blocks.{i}.ln1.gamma"].stage for i in range(5)] == [0, 0, 0, 1, 1]
    assert builtin_layout(model, tp=1, pp=6)[1] == ["pp = 6 exceeds the model's 5 layers"]
