"""The Optuna sampler behind each ``search.sampler`` name.

Contract: :func:`make_sampler` returns a fresh sampler for a study of ``n_trials`` trials for
each name of :data:`SAMPLERS` (``tpe`` and ``auto``: Optuna's TPE over a bounded view of a long
study, `autotune.search.bounded_tpe`), or raises `autotune.spec.errors.SpecError` (exit 2) for another
name or when the sampler's optional package is missing. It
never sees storage or the search loop; ``grid`` is a random sampler because the loop enqueues
every candidate itself.
"""

from __future__ import annotations

import importlib.util

import optuna

from autotune.search.bounded_tpe import BoundedTPESampler
from autotune.spec.errors import SpecError

# The names, defined where the model.yaml's search.sampler and the CLI's --sampler are checked
# (the spec, which never imports search); tests/e2e/test_search.py builds one sampler per name.
from autotune.spec.model_yaml import SAMPLERS


def make_sampler(name: str, seed: int | None, n_trials: int) -> optuna.samplers.BaseSampler:
    """The Optuna sampler for ``name``; SpecError when its optional package is missing."""
    if name not in SAMPLERS:
        raise SpecError(f"search.sampler: must be one of {', '.join(SAMPLERS)}, got {name!r}")
    if name in ("tpe", "auto"):  # auto: the cost model's prior proposes, TPE fills in
        # benchmarks/search_efficiency.py: few random startup trials (≈ n/6, 2 to 10) reach the
        # optimum in far fewer trials than Optuna's default 10; `group` made it worse. The
        # constant liar keeps concurrent trials apart. Bounded: a long study's best trials and
        # its latest, not all of them (`autotune.search.bounded_tpe`).
        return BoundedTPESampler(
            seed=seed,
            multivariate=True,
            constant_liar=True,
            n_startup_trials=min(10, max(2, n_trials // 6)),
        )
    if name in ("random", "grid"):  # grid: the loop enqueues every candidate itself
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed)
    # CMA-ES and GP need packages Optuna imports only once it is sampling (GP after its 10
    # startup trials): check now, so a missing one is an input error, not a crash mid-study.
    needs = {"cmaes": ("cmaes",), "gp": ("torch", "scipy")}[name]
    missing = [pkg for pkg in needs if importlib.util.find_spec(pkg) is None]
    if missing:
        raise SpecError(
            f"search.sampler: {name} needs {', '.join(missing)}; install it with: "
            f"pip install 'autotune[{name}]'"
        )
    if name == "cmaes":
        # CMA-ES searches the numeric knobs (integer params, `autotune.spec.encoding`) jointly; it
        # leaves the categorical ones (jit_level, recompute) and the conditional ones
        # (micro_batches, grad_accum: not in every trial) to its independent sampler, which
        # would otherwise warn on every trial.
        return optuna.samplers.CmaEsSampler(seed=seed, warn_independent_sampling=False)
    return optuna.samplers.GPSampler(seed=seed)
