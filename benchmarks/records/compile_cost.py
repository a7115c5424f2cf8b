# measured at 55110d5
# A decision record (docs/mindspore-cpu.md): what chose the code as it is; not kept in step with
# later code.
"""What a new step graph costs to compile: the tiny GPT's training step, built and compiled
over and over in one process (as a warm worker compiles trial after trial), each way of writing
it side by side.

Ways (rows), rounds interleaved so machine noise hits all alike; each compile is a new network,
optimizer and step cells, so every one is a miss:

- grad_accum 1, zero counts as a list of ``ops.count_nonzero`` calls (the step before the
  HyperMap: MindSpore parses and infers each call on its own);
- grad_accum 1, zero counts as one HyperMap (`autotune.train.step.train_step.zero_counts`, what runs);
- grad_accum 1, without loss scaling (so without zero counts, as float32 compute runs): a floor;
- grad_accum 2, the update in a second forward + backward graph (the last micro-batch's
  `autotune.train.step.train_step.TrainStep`, as the step's apply call was before) beside the accumulate graph;
- grad_accum 2, the update a graph of its own (`autotune.train.step.train_step.ApplyStep`, what runs).

Prints, per way, the median seconds of its first call (compile of every graph plus one step) and
of a second call (one step), over ``--rounds`` rounds. ``--layers N`` builds the model with N
layers instead of the tiny GPT's; ``--jit-level`` compiles at another level than the
tiny GPT's O1; ``--compile-config NAME=VALUE`` sets MindSpore's
``mindspore.graph._parse.compile_config`` before the first compile (``COMPILE_PROFILE=1``: MindSpore
prints each compile phase's seconds on stdout); ``--lazy-inline`` decorates the transformer block
with MindSpore's ``@lazy_inline`` (compile a repeated layer once).

    python benchmarks/records/compile_cost.py [--rounds 3] [--layers N] [--jit-level O0] [--compile-config NAME=VALUE ...] [--lazy-inline]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from autotune.spec.model_yaml import load_spec  # noqa: E402

WAYS = (
    "accum 1, count_nonzero list",
    "accum 1, HyperMap counts",
    "accum 1, no loss scaling",
    "accum 2, update with a 2nd fwd+bwd",
    "accum 2, update graph of its own",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--layers", type=int)
    parser.add_argument("--jit-level", default="O1", choices=("O0", "O1", "O2"))
    parser.add_argument("--compile-config", nargs="+", default=[], metavar="NAME=VALUE")
    parser.add_argument("--lazy-inline", action="store_true")
    args = parser.parse_args()

    from mindspore.graph._parse import compile_config

    for setting in args.compile_config:
        name, _, value = setting.partition("=")
        setattr(compile_config, name, value)

    import mindspore as ms
    from mindspore import ops
    from mindspore.common.parameter import ParameterTuple

    from autotune.train import models
    from autotune.train.models import data, transformer, weights
    from autotune.train.parallel import tp_layers
    from autotune.train.runtime import session
    from autotune.train.step import train_step as step
    from autotune.train.step.engine import make_optimizer, optimizer_order

    ms.set_context(mode=ms.GRAPH_MODE)
    session.numpy2_workaround(ms)
    spec = load_spec(ROOT / "examples" / "tiny_gpt.yaml")
    model = spec.model.as_config()
    if args.layers:
        model["num_layers"] = args.layers
    if args.lazy_inline:
        transformer.DecoderBlock.__init__ = ms.lazy_inline(transformer.DecoderBlock.__init__)
    shard = spec.train.global_batch_size // 2  # one dp2 rank's batch
    x, y = data.TokenChains(shard, model["seq_length"], model["vocab_size"])(0)
    hyper_map_counts = step.zero_counts

    def list_counts(grads):
        return ops.stack([grad.size - ops.count_nonzero(grad) for grad in grads])

    def build(way):
        network = models.build_network(model)
        weights.initialize(network, model, models.SINGLE, seed=0)
        step.set_compute_dtype(network, ms.float16)
        params = ParameterTuple(optimizer_order(network.trainable_params()))
        loss_fn = tp_layers.TokenCrossEntropy()
        accum = 2 if way.startswith("accum 2") else 1
        step.zero_counts = list_counts if "count_nonzero" in way else hyper_map_counts
        accumulate, apply = step.build_steps(
            network,
            loss_fn,
            make_optimizer(list(params), 1e-3),
            accum_steps=accum,
            scaling="no loss scaling" not in way,
            loss_scale=2.0**16,
            jit_level=args.jit_level,
            weights=params,
        )
        n = shard // accum
        xs = [ms.Tensor(x[j * n : (j + 1) * n]) for j in range(accum)]
        ys = [ms.Tensor(y[j * n : (j + 1) * n]) for j in range(accum)]
        if accumulate is None:
            return lambda: apply(xs[0], ys[0])[0].asnumpy()
        if "2nd fwd+bwd" in way:
            # the apply call as it was: the last micro-batch's forward and backward under the update
            state = step.TrainState(params, 1, 2.0**16, step.SCALE_WINDOW, count_zeros=True)
            last = step.TrainStep(
                step.NetWithLoss(network, loss_fn),
                make_optimizer(list(params), 1e-3),
                state,
                scaling=True,
                parallel=step.Parallelism(),
                weights=params,
            )
            last.set_train()
            last.set_jit_config(ms.JitConfig(jit_level=args.jit_level))
            return lambda: (accumulate(xs[0], ys[0]), last(xs[1], ys[1])[0].asnumpy())
        return lambda: ([accumulate(a, b) for a, b in zip(xs, ys)], apply()[0].asnumpy())

    first = {way: [] for way in WAYS}
    second = {way: [] for way in WAYS}
    try:
        build(WAYS[1])()  # the process's first compile pays one-off costs: not any way's
    except RuntimeError as exc:  # e.g. --lazy-inline on CPU: MindSpore's verdict, then stop
        print(f"MindSpore refused the step graph: {str(exc).strip().splitlines()[0]}")
        raise SystemExit(1) from None
    for round_ in range(args.rounds):
        for way in WAYS:
            call = build(way)
            started = time.perf_counter()
            call()
            compiled = time.perf_counter()
            call()
            first[way].append(compiled - started)
            second[way].append(time.perf_counter() - compiled)
            print(
                f"    round {round_} {way}: first call {first[way][-1]:.2f} s",
                file=sys.stderr,
                flush=True,
            )
    step.zero_counts = hyper_map_counts
    print(
        f"\nthe tiny GPT's step graphs ({model['num_layers']} layers, one dp2 shard, float16, "
        f"{args.jit_level}), compiled in one process; median of {args.rounds} rounds\n"
    )
    print(f"{'way':>36} | first call s (compile + step) | second call s (a step)")
    print("-" * 92)
    for way in WAYS:
        print(
            f"{way:>36} | {statistics.median(first[way]):>29.2f} | {statistics.median(second[way]):>22.3f}"
        )


if __name__ == "__main__":
    main()
