"""The trial process around the step: `session` (MindSpore's session, set up once and per
trial), `device`, `device_memory` and `device_smi` (the device's bring-up and its memory),
`compile_cache`
(compiled graphs reused across trials), `serve` (workers that stay up between trials) and
`lifetime` (a process that dies with its parent)."""
