"""msrun's program for a MindFormers trial: the user's ``run_mindformer.py``, with autotune's marks.

Run by MindFormers' own interpreter (never imported by autotune; standard library, MindSpore and
MindFormers only)::

    msrun … autotune_mf_entry.py RUN_MINDFORMER_PY --config trial.yaml --run_mode train …

It runs RUN_MINDFORMER_PY as ``__main__`` (``runpy``, its folder first on ``sys.path``, as
``python RUN_MINDFORMER_PY`` would) and adds what autotune's launcher reads from a trial's logs
(the words are `autotune.train`'s, repeated here because this file cannot import autotune):

- msrun's scheduler role only joins the cluster (``set_device`` of the host, ``communication.init``:
  `autotune.train.runtime.device.serve_cluster`'s rule) instead of importing MindFormers and
  parsing the config, and on a node other than rank 0's (``AUTOTUNE_NODE``) exits at once, as
  autotune's own program does (``autotune/train/__main__.py``);
- ``AUTOTUNE_MF_STARTED``: the epoch second the process started (the trial's ``started_at``);
- once MindFormers' ``build_context`` returned (the context set, communication initialised: the
  launch is done), the line ``autotune.train running the candidate`` on stderr; a failure inside
  it is the launch's: the verdict ``autotune.train: LaunchError: …``;
- a failure after it ends with one verdict line on stderr, after the traceback:
  ``autotune.train: Refused: <Type>: <first line>`` while MindFormers was still building the run
  (config, model, optimizer, data: the recorder had not seen training begin,
  ``AUTOTUNE_MF_TRAINING``) — MindFormers or MindSpore refused the candidate at start-up — else
  ``autotune.train: <Type>: <first line>``; exit code 1.
"""

import os
import runpy
import sys
import time

STARTED = "AUTOTUNE_MF_STARTED"
TRAINING = "AUTOTUNE_MF_TRAINING"  # set by the recorder's on_train_begin
CANDIDATE_STARTED = "autotune.train running the candidate"
VERDICT = "autotune.train:"
REFUSED = "autotune.train: Refused:"
LAUNCH_FAILED = "autotune.train: LaunchError:"
NODE = "AUTOTUNE_NODE"  # a trial's node index, on each node of one that spans several


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""


def _serve_cluster() -> int:
    import mindspore as ms
    from mindspore import communication

    ms.set_device("CPU")
    communication.init()
    return 0


class LaunchError(RuntimeError):
    """The launch failed (context or communication), before the candidate ran."""


def main() -> int:
    os.environ[STARTED] = repr(time.time())
    os.environ.pop(TRAINING, None)
    if os.environ.get("MS_ROLE") == "MS_SCHED":
        if os.environ.get(NODE, "0") != "0":  # rank 0's node serves the job
            print(f"autotune.mf scheduler of node {os.environ[NODE]} stands down", flush=True)
            return 0
        try:
            return _serve_cluster()
        except Exception as exc:  # noqa: BLE001  (the cluster's failure, never the candidate's)
            import traceback

            traceback.print_exc()
            _say(f"{LAUNCH_FAILED} scheduler: {type(exc).__name__}: {_first_line(exc)}")
            return 3
    script = os.path.abspath(sys.argv[1])
    sys.argv = sys.argv[1:]
    import mindformers.core.context as mf_context

    build = mf_context.build_context

    def build_context(config):
        try:
            built = build(config)
        except Exception as exc:
            raise LaunchError(f"{type(exc).__name__}: {_first_line(exc)}") from exc
        _say(CANDIDATE_STARTED)
        return built

    # run_mindformer.py imports the name from this module, after this
    mf_context.build_context = build_context
    sys.path.insert(0, os.path.dirname(script))
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit:
        raise
    except BaseException as exc:
        import traceback

        traceback.print_exc()
        if isinstance(exc, LaunchError):
            _say(f"{LAUNCH_FAILED} {_first_line(exc)}")
        elif os.environ.get(TRAINING) != "1":
            _say(f"{REFUSED} {type(exc).__name__}: {_first_line(exc)}")
        else:
            _say(f"{VERDICT} {type(exc).__name__}: {_first_line(exc)}")
        _leave_cluster()
        return 1
    return 0


def _leave_cluster() -> None:
    """Tell msrun's scheduler this rank is done: else it waits out its heartbeat timeout (~30 s
    measured) before msrun returns a failed trial."""
    try:
        from mindspore import communication

        communication.release()
    except Exception:  # noqa: BLE001  (never initialised, or already gone: nothing to leave)
        pass


if __name__ == "__main__":
    sys.exit(main())
