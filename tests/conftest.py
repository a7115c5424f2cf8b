"""What the test packages share: where things are, the model.yaml texts many tests start from,
and the fixtures every package may use.

The texts are the ``model:`` and ``train:`` sections of a model.yaml (with ``cluster:`` where
every user of the text runs the same one); a test completes one with its own study name, cluster
and search: ``"study: s\\n" + SIM8_MODEL + "cluster: ...\\nsearch: ..."``.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"

# The 8-layer, 1024-wide GPT of the simulate and replay studies: big enough that the layouts of 8
# A100s differ in time and memory, never run on this CPU.
SIM8_MODEL = """\
model: {family: transformer, num_layers: 8, hidden_size: 1024, num_heads: 16, seq_length: 1024,
        vocab_size: 32000, dtype: bfloat16}
train: {global_batch_size: 64}
"""

# The tiny GPT a real CPU study trains: a trial of 8 steps takes seconds.
TINY_GPT_MODEL = """\
model: {family: transformer, num_layers: 2, hidden_size: 32, num_heads: 2, seq_length: 16,
        vocab_size: 64, dtype: float16}
train: {global_batch_size: 8, learning_rate: 5.0e-3, total_steps: 200}
"""

# A small GPT simulated on two CPU devices: studies that need the whole loop, instantly.
SMALL_CPU_SIMULATE = """\
model: {family: transformer, num_layers: 2, hidden_size: 64, num_heads: 4, seq_length: 32,
        vocab_size: 256, dtype: float16}
train: {global_batch_size: 16}
cluster: {backend: simulate, devices: 2, devices_per_node: 2, device: cpu}
"""

# The smallest model a spec validates (no dtype: the default), for the spec's own checks.
MINI_MODEL = """\
model: {family: transformer, num_layers: 2, hidden_size: 32, num_heads: 4, seq_length: 16,
        vocab_size: 64}
"""
