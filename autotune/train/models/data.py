"""Synthetic data with a learnable signal, deterministic from the seed (numpy only).

Each dataset is a callable ``dataset(step, shard, num_shards) -> (inputs, labels)`` returning
shard ``shard`` of ``num_shards`` equal shards of the global batch for optimizer step ``step``
(see `autotune.train.models.entry`). The global batch depends only on (seed, step), so every
candidate of a study — whatever its dp and grad_accum — trains on the same samples.

- `TokenChains` (transformer): sequences in which the next token is ``(a·x + b) mod vocab``
  of the current one, replaced by a random token with probability ``noise``. A model learns the
  bigram map within a few dozen steps; the loss floor is set by the noise.
- `TeacherClasses` (mlp): Gaussian features labelled by the argmax of a fixed random linear
  teacher plus a Zipf class prior (vocab_size classes) — separable, and the skewed class
  frequencies give the loss something to learn within a few dozen steps.
"""

import numpy as np

_TEACHER, _BATCH = 0, 1  # streams of the seed sequence


class _GlobalBatches:
    """Common part: generate the global batch of a step, hand out one shard of it."""

    def __init__(self, global_batch_size, seed):
        self.global_batch_size, self.seed = global_batch_size, seed

    def __call__(self, step, shard=0, num_shards=1):
        if self.global_batch_size % num_shards:
            raise ValueError(
                f"global batch {self.global_batch_size} does not split into {num_shards} shards"
            )
        rng = np.random.default_rng([self.seed, _BATCH, step])
        inputs, labels = self._generate(rng, self.global_batch_size)
        n = self.global_batch_size // num_shards
        return inputs[shard * n : (shard + 1) * n], labels[shard * n : (shard + 1) * n]

    def _generate(self, rng, n):
        raise NotImplementedError


class TokenChains(_GlobalBatches):
    """int32 ids (n, seq) and next-token labels (n, seq) from one chain of seq+1 tokens."""

    def __init__(self, global_batch_size, seq_length, vocab_size, seed=0, noise=0.1, a=5, b=3):
        super().__init__(global_batch_size, seed)
        self.seq_length, self.vocab_size, self.noise, self.a, self.b = (
            seq_length,
            vocab_size,
            noise,
            a,
            b,
        )

    def _generate(self, rng, n):
        tokens = np.empty((n, self.seq_length + 1), np.int64)
        tokens[:, 0] = rng.integers(0, self.vocab_size, n)
        for t in range(self.seq_length):
            follow = (self.a * tokens[:, t] + self.b) % self.vocab_size
            random = rng.integers(0, self.vocab_size, n)
            tokens[:, t + 1] = np.where(rng.random(n) < self.noise, random, follow)
        tokens = tokens.astype(np.int32)
        return tokens[:, :-1], tokens[:, 1:]


class TeacherClasses(_GlobalBatches):
    """float32 features (n, dim) and int32 class labels (n,) of a random linear teacher."""

    def __init__(self, global_batch_size, dim, classes, seed=0):
        super().__init__(global_batch_size, seed)
        self.dim = dim
        # teacher logits of std 3 plus a Zipf log-prior: skewed class frequencies (like tokens)
        # give a few dozen steps something to learn even with more classes than samples, while
        # the features still decide most labels (256 classes: ~240 occur, entropy 4.7 of 5.5 nats)
        self.teacher = (
            3.0
            * np.random.default_rng([seed, _TEACHER]).standard_normal((dim, classes))
            / np.sqrt(dim)
        )
        self.log_prior = -np.log(np.arange(1, classes + 1))

    def _generate(self, rng, n):
        x = rng.standard_normal((n, self.dim))
        return x.astype(np.float32), np.argmax(x @ self.teacher + self.log_prior, axis=1).astype(
            np.int32
        )
