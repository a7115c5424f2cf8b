"""``python -m autotune.train CONFIG_JSON``, or this file's path as msrun's program; with
``--serve POOL_DIR`` instead of a config, workers that run trial after trial
(`autotune.train.runtime.serve`), each trial's exit code and verdict as below; with ``--warm-up
BACKEND``, a node's warm-up: the device brought up and a first op made (`autotune.train.runtime.session.
warm_up`, `autotune.execution.warmup`), 0 or 3 as a launch.

Exit codes: 0 done (metrics written); 2 the config cannot be run (bad field, bad model entry);
1 the run failed; 3 the launch failed before the candidate ran (``LaunchError``: the device's
bring-up, communication init, the cluster join, the process groups). On failure the last stderr line is one line,
``autotune.train: <ExceptionType>: <message>`` (after the traceback), so a driver reading the
log tail sees e.g. ``MemoryError`` for an out-of-memory trial, and ``autotune.train: LaunchError:``
(`autotune.train.LAUNCH_FAILED`) for a failure that is not the candidate's. Exit codes 1 and 2
with their verdict, or any failure after the ``CANDIDATE_STARTED`` line, are the candidate's.

msrun starts a scheduler (this program with ``MS_ROLE=MS_SCHED``) on every node whose own address
is ``--master_addr``: with several Ray nodes on one host, every node of a trial is. Only rank 0's
node serves the job; on the others (``AUTOTUNE_NODE`` set to their node index by the runner) the
scheduler exits 0 at once, where it would otherwise fail to bind the taken port and make that
node's msrun fail a trial whose workers all finished. On rank 0's node the scheduler runs only
`autotune.train.runtime.device.serve_cluster` (it never reads the config nor opens the trial's device);
a failure there is the launch's (exit 3).
"""

import os
import sys

if not __package__:
    # Run as a file path (msrun): Python put this folder first on sys.path, where our module
    # names (data, models, …) could shadow installed packages. Import the package absolutely,
    # from the tree this file belongs to.
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _here]
    _root = os.path.dirname(os.path.dirname(_here))
    if _root not in sys.path:
        sys.path.insert(0, _root)

import json  # noqa: E402  (after the sys.path repair above)
import traceback  # noqa: E402

from autotune.procfs import started_at  # noqa: E402
from autotune.train import LAUNCH_FAILED, NODE_VARIABLE  # noqa: E402
from autotune.train.runtime.lifetime import die_with_parent  # noqa: E402


def _fail(exc: BaseException) -> str:
    first = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
    return f"autotune.train: {type(exc).__name__}: {first}"


def main(argv=None) -> int:
    started = started_at()
    args = sys.argv[1:] if argv is None else argv
    if os.environ.get("MS_ROLE") == "MS_SCHED" and os.environ.get(NODE_VARIABLE, "0") != "0":
        # not a verdict line (VERDICT): nothing was run
        print(
            f"autotune.train scheduler of node {os.environ[NODE_VARIABLE]} stands down: "
            "rank 0's node serves the job",
            flush=True,
        )
        return 0
    if os.environ.get("MS_ROLE") == "MS_SCHED":
        from autotune.train.runtime.device import serve_cluster

        try:
            return serve_cluster()
        except Exception as exc:  # noqa: BLE001  (the cluster's failure, never the candidate's)
            traceback.print_exc()
            print(
                f"{LAUNCH_FAILED} scheduler: {_fail(exc).removeprefix('autotune.train: ')}",
                file=sys.stderr,
                flush=True,
            )
            return 3
    if len(args) == 2 and args[0] == "--warm-up":
        from autotune.train.runtime.session import LaunchError, warm_up

        try:
            print(f"autotune.train warm-up: {warm_up(args[1])}", flush=True)
            return 0
        except LaunchError as exc:
            print(_fail(exc), file=sys.stderr, flush=True)
            return 3
    if len(args) == 2 and args[0] == "--serve":
        from autotune.train.runtime.serve import serve

        return serve(args[1], started, _run_one)
    if len(args) != 1:
        print(
            "usage: python -m autotune.train CONFIG_JSON | --serve POOL_DIR | --warm-up BACKEND",
            file=sys.stderr,
        )
        return 2
    return _run_one(args[0], None, started)[0]


def _run_one(config_path: str, session, started: float, leftover_mb: float = 0.0):
    """Run the trial of ``config_path`` — in ``session`` (a worker that stays up), or in a
    session opened here — printing its verdict; returns ``(exit code, session)``."""
    try:
        with open(config_path) as f:
            config = json.load(f)
    except (OSError, ValueError) as exc:
        print(f"autotune.train: cannot read config {config_path}: {exc}", file=sys.stderr)
        return 2, session
    from autotune.spec.entry import EntryError
    from autotune.train import program

    try:
        if session is None:
            session = program.open_trial_session(config)
        result = program.run_trial(config, session, started, leftover_mb)
    except (program.ConfigError, EntryError) as exc:
        print(_fail(exc), file=sys.stderr)
        return 2, session
    except program.LaunchError as exc:
        traceback.print_exc()
        sys.stderr.flush()
        print(_fail(exc), file=sys.stderr)
        return 3, session
    except Exception as exc:  # noqa: BLE001  (any failure must become an exit code and one clear line)
        traceback.print_exc()
        sys.stderr.flush()
        print(_fail(exc), file=sys.stderr)
        return 1, session
    print(f"autotune.train: done: {json.dumps(result)}", flush=True)
    return 0, session


if __name__ == "__main__":
    if os.environ.get("MS_ROLE"):  # started by msrun: end with it, even when it is SIGKILLed
        die_with_parent()
    sys.exit(main())
