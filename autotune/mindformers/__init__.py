"""MindFormers: the config autotune writes for it, and MindFormers runs as a study's trials.

autotune never imports MindFormers (it pins numpy < 2 and its own MindSpore, so it lives in a
venv of its own): this package writes MindFormers' config (`config`, the export's and the
trial's alike; `cpu_form`, its form for MindFormers on CPU; `base`, the base config's keys it
keeps; `run_settings`, what launch.yaml states too), and runs ``run_mindformer.py`` as a trial program in MindFormers' interpreter
(``trial.program: mindformers``: `trial` the trial's config, `launch` its command line,
`results` its measurements read back, `data` its synthetic dataset). The files under
:data:`CLUSTER_DIR` run in that interpreter — passed by path to ``run_mindformer.py
--register_path`` or run by it — and import MindFormers, MindSpore and the standard library
only; nothing of autotune imports them (tests/house/test_house.py).
"""

from pathlib import Path

CLUSTER_DIR = Path(__file__).resolve().parent / "cluster"
