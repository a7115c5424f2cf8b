"""How one rank takes its part of a layout, on explicit collectives (the same code on CPU, GPU
and Ascend): `groups` (where the rank sits, its process groups, the collective operators),
`tp_layers` (Megatron-style tensor-parallel layers), `pipeline` (a stage and its 1F1B schedule),
`sharding` (the parallel optimizer's shards)."""


def __getattr__(name):
    # this package was the module `groups` before: its names still resolve here, with a warning
    from autotune.moved import forward

    return forward(__name__, name)
