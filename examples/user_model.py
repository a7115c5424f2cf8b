"""A user model for ``model.entry: examples/user_model.py:build`` (the contract: autotune.train.models.entry).

A small residual classifier of points drawn around ``num_classes`` random centres: the loss
falls within a few dozen steps. Sizes come from the ``model`` section of the config
(``hidden_size``, ``num_layers``, plus this model's own ``input_size`` and ``num_classes``).
"""

import numpy as np
from mindspore import nn


class Block(nn.Cell):
    def __init__(self, hidden):
        super().__init__()
        self.norm = nn.LayerNorm((hidden,))
        self.fc = nn.Dense(hidden, hidden)
        self.act = nn.ReLU()

    def construct(self, x):
        return x + self.act(self.fc(self.norm(x)))


class Classifier(nn.Cell):
    def __init__(self, input_size, hidden, layers, classes):
        super().__init__()
        self.inp = nn.Dense(input_size, hidden)
        self.blocks = nn.CellList([Block(hidden) for _ in range(layers)])
        self.out = nn.Dense(hidden, classes)

    def construct(self, x):
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        return self.out(x)

    def apply_recompute(self, mode):
        """The ``recompute`` knob: full = each block, selective = each block's Dense + ReLU."""
        for block in self.blocks:
            if mode == "full":
                block.recompute()
            elif mode == "selective":
                block.fc.recompute()


class Clusters:
    """``dataset(step, shard, num_shards)``: shard of the global batch of ``step``, from (seed, step)."""

    def __init__(self, global_batch, input_size, classes, seed):
        self.global_batch, self.seed = global_batch, seed
        self.centres = np.random.default_rng([seed, 0]).standard_normal((classes, input_size)) * 2.0

    def __call__(self, step, shard, num_shards):
        rng = np.random.default_rng([self.seed, 1, step])
        labels = rng.integers(0, len(self.centres), self.global_batch)
        points = self.centres[labels] + rng.standard_normal(
            (self.global_batch, self.centres.shape[1])
        )
        n = self.global_batch // num_shards
        part = slice(shard * n, (shard + 1) * n)
        return points[part].astype(np.float32), labels[part].astype(np.int32)


def build(config):
    model = config["model"]  # dimensions an entry model leaves out arrive as None
    input_size, classes = model.get("input_size") or 16, model.get("num_classes") or 8
    network = Classifier(
        input_size, model.get("hidden_size") or 64, model.get("num_layers") or 2, classes
    )
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    dataset = Clusters(
        config["train"]["global_batch_size"], input_size, classes, config.get("seed", 0)
    )
    return network, loss_fn, dataset
