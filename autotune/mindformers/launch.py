"""How a MindFormers trial starts: msrun of MindFormers' interpreter running autotune's entry.

Contract: :func:`launch` returns ``(argv, environment, cwd)`` for one node of a trial whose
config's ``mindformers`` section (`autotune.mindformers.trial.trial_section`) names
``run_mindformer.py``, MindFormers' interpreter and the data:

- always msrun, even for one worker (``use_parallel`` makes MindFormers initialise
  communication): the msrun beside that interpreter (its MindSpore's), with the options of
  `autotune.train.msrun.msrun_args`, as autotune's own trials and exports spell them; msrun
  starts its workers with the ``python`` on PATH, so that interpreter's folder comes first;
- the program: the entry (`autotune.mindformers.CLUSTER_DIR`) running ``run_mindformer.py
  --config <trial>/trial.yaml --run_mode train --register_path FOLDER`` (the recorder and
  the CPU training step are registered from there), plus ``--train_dataset_dir DATA`` for a
  synthetic dataset. FOLDER is CLUSTER_DIR, or with the user's own register path
  (``trial.register_path``) :func:`register_folder`'s: MindFormers takes one folder
  (``REGISTER_PATH``: ``auto_register`` loads ``module.Class`` from it, and
  ``run_mindformer.py`` puts it on ``sys.path``), so the trial's holds a link to every entry
  of the user's folder and to autotune's files beside them;
- the environment: the checkout first on PYTHONPATH (``scripts/msrun_launcher.sh``'s one real
  effect: a source checkout's ``mindformers`` wins), MindFormers' module cache
  (``OM_MODULES_CACHE``) and logs (``LOG_MF_PATH``) under the trial folder — else it writes
  them into the checkout, and concurrent trials overwrite each other's copies —, a failed
  compile's ``analyze_fail.ir`` there too (``MS_OM_PATH``; else ``./rank_<r>/om/`` in the
  checkout), no ``MS_ENABLE_TFT`` (fault tolerance refuses a run without ``CheckpointMonitor``),
  and with ``compile_cache`` (a folder of the candidate's own) MindSpore's compile cache
  (``MS_COMPILER_CACHE_ENABLE``, ``MS_COMPILER_CACHE_PATH``): a re-run of the candidate loads
  the graphs its first run compiled;
- the working folder: the checkout (users' configs name files relative to it).
"""

from __future__ import annotations

import os
from pathlib import Path

from autotune.files import folder_once
from autotune.mindformers import CLUSTER_DIR
from autotune.mindformers.trial import TRIAL_FILE
from autotune.train.msrun import msrun_args

ENTRY = CLUSTER_DIR / "autotune_mf_entry.py"
MODULES_DIR = "om_modules"  # MindFormers' copies of the registered files, per trial
REGISTER_DIR = "register"  # the user's register folder and autotune's files, per trial
LOG_SUBDIR = "mf"  # MindFormers' own logs, under the trial's log folder (classify reads them)
GRAPHS_DIR = "graphs"  # a failed compile's analyze_fail.ir (MindSpore's MS_OM_PATH), per trial
# Variables a trial's MindFormers must not inherit: fault tolerance needs CheckpointMonitor
# (`check_tft_valid`), and autotune's venv is not MindFormers'.
DROPPED_VARIABLES = ("MS_ENABLE_TFT", "VIRTUAL_ENV", "PYTHONHOME")


def register_folder(mf: dict, trial_dir: Path) -> Path:
    """The folder a trial passes to ``run_mindformer.py --register_path`` (see the module doc):
    CLUSTER_DIR, or with the user's ``register_path`` ``<trial>/register``, links to each entry
    of the user's folder and to autotune's cluster files (autotune's win a name both have).
    Every node of a trial makes the same one; on a folder they share, all use the first made
    (`autotune.files.folder_once`)."""
    user = mf.get("register_path")
    if not user:
        return CLUSTER_DIR

    def link(folder: Path) -> None:
        ours = {path.name: path for path in CLUSTER_DIR.glob("*.py")}
        theirs = {path.name: path for path in Path(user).iterdir() if path.name not in ours}
        for name, path in {**theirs, **ours}.items():
            (folder / name).symlink_to(path)

    return folder_once(trial_dir / REGISTER_DIR, link)


def launch(
    mf: dict,
    trial_dir: Path,
    log_dir: Path,
    env: dict,
    *,
    workers: int,
    local_workers: int,
    master_port: int,
    master_addr: str = "127.0.0.1",
    node_rank: int | None = None,
    bind_core: bool = False,
) -> tuple[list[str], dict, Path]:
    """``(argv, environment, cwd)`` of this node's msrun (see the module doc); ``env``: the
    environment to start from (the launcher's, the backend's variables)."""
    python = Path(mf["python"])
    checkout = Path(mf["run_mindformer"]).parent
    options = msrun_args(
        workers,
        local_workers,
        master_port=master_port,
        master_addr=master_addr,
        node_rank=node_rank,
        log_dir=str(log_dir),
        bind_core=bind_core,
    )
    program = [
        str(ENTRY),
        mf["run_mindformer"],
        "--config",
        str(trial_dir / TRIAL_FILE),
        "--run_mode",
        "train",
        "--register_path",
        str(register_folder(mf, trial_dir)),
    ]
    if mf.get("data"):
        program += ["--train_dataset_dir", mf["data"]]
    environment = {k: v for k, v in env.items() if k not in DROPPED_VARIABLES}
    environment.update(
        PATH=os.pathsep.join([str(python.parent), env.get("PATH", "")]),
        PYTHONPATH=os.pathsep.join(filter(None, [str(checkout), env.get("PYTHONPATH")])),
        OM_MODULES_CACHE=str(trial_dir / MODULES_DIR),
        LOG_MF_PATH=str(log_dir / LOG_SUBDIR),
        MS_OM_PATH=str(trial_dir / GRAPHS_DIR),
    )
    if mf.get("compile_cache"):  # this candidate's own folder (`trial.compile_cache_key`)
        environment.update(MS_COMPILER_CACHE_ENABLE="1", MS_COMPILER_CACHE_PATH=mf["compile_cache"])
    environment.setdefault("GLOG_v", "3")  # MindSpore's C++ logs: errors only
    return [str(python.with_name("msrun")), *options, *program], environment, checkout
