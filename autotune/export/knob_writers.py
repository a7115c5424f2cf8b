"""Where each knob is written in each export document, registered by knob name.

Contract: :data:`LAUNCH_YAML` and :data:`MINDFORMERS_YAML` are `autotune.spec.knobs.KnobHooks`
of the two documents that state the tuned settings (launch.yaml's MindSpore calls and
mindformers.yaml's MindFormers keys). A writer is ``writer(value, spec, candidate, document)``: it
sets its knob's keys in ``document`` (a dict, in the order the document lists its sections:
:func:`autotune.export.configs.launch_yaml` and :func:`autotune.mindformers.config.overlay` build
each section a knob owns as a placeholder its writer fills or removes, and call every writer
after the rest). A knob whose keys are one call's arguments together with other knobs' (the
parallel layout) is stated ``in_place`` instead. train_config.json and summary.json carry every
knob of the candidate as it is (``knobs``), and launch.yaml's ``knobs`` section each knob's
:attr:`~autotune.spec.knobs.Knob.mindspore` text, so no knob needs a writer there.
"""

from __future__ import annotations

from autotune.mindformers.config import MINDFORMERS_YAML
from autotune.spec.knobs import KnobHooks

LAUNCH_YAML = KnobHooks("export: launch.yaml")
DOCUMENTS = {"launch.yaml": LAUNCH_YAML, "mindformers.yaml": MINDFORMERS_YAML}
