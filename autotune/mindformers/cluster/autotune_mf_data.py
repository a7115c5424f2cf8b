"""A synthetic MindRecord for a MindFormers trial: random tokens of the config's shape.

Run by MindFormers' own interpreter, so the file is written by the MindSpore that reads it
(never imported by autotune; standard library, numpy and MindSpore only)::

    python autotune_mf_data.py OUT ROWS TOKENS VOCAB COLUMN [COLUMN …]

writes ``ROWS`` rows of ``TOKENS`` int32 tokens drawn uniformly from ``[0, VOCAB)`` (seed 0: the
same file every time), each column the same tokens (``input_ids`` and ``labels`` of a causal
language model: MindFormers shifts them itself), into the MindRecord ``OUT`` (and ``OUT.db``).
The caller writes into a folder of its own and moves the folder into place when this exits 0.
"""

import sys

import numpy as np
from mindspore.mindrecord import FileWriter


def main(argv: list[str]) -> int:
    out, rows, tokens, vocab, *columns = argv
    rows, tokens, vocab = int(rows), int(tokens), int(vocab)
    writer = FileWriter(out, shard_num=1, overwrite=True)
    writer.add_schema({c: {"type": "int32", "shape": [-1]} for c in columns}, "autotune tokens")
    rng = np.random.default_rng(0)
    for start in range(0, rows, 1024):  # in blocks: a large model's rows are long
        block = rng.integers(0, vocab, (min(1024, rows - start), tokens), dtype=np.int32)
        writer.write_raw_data([{c: row for c in columns} for row in block])
    writer.commit()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
