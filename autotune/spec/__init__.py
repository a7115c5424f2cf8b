"""The user's input and what it allows: model.yaml, the knobs, the backends, the search space,
a candidate and its hard constraints, and how a knob becomes an Optuna param.

Modules, each imported by name (this file re-exports nothing, so that importing one of them —
the trial program imports `knobs`, `backends` and `entry` — never drags in the others):
`errors` (SpecError), `yaml_file` (reading YAML safely), `model_yaml` (model.yaml → Spec;
its ``model`` section, `model_section`), `objectives`, `knobs`, `backends`, `entry` (the one
loader of a ``model.entry`` network), `candidate`, `constraints`, `space` (what it narrows
before searching, `space_narrowing`), `encoding` (the only module that imports anything of
Optuna: ``optuna.distributions``).
"""
