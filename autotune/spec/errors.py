"""The error of bad user input."""


class SpecError(ValueError):
    """Bad user input; the message names the file and field. The CLI exits 2 on it."""
