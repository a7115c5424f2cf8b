"""One rank's training step: `engine` (the network part, optimizer and step function for the
rank's place in the layout), `train_step` (the compiled step: accumulation, the DP all-reduce,
loss scaling), `schedule` (the learning rate), `probe` (the underflow probe) and `routing` (the
router's load statistics)."""


def __getattr__(name):
    # this package was the module `train_step` before: its names still resolve here, with a warning
    from autotune.moved import forward

    return forward(__name__, name)
