"""The project's own errors. The library raises them; the CLI turns each into one line and an
exit code."""


class MsaError(Exception):
    """Base of every error `msa` reports to a user."""

    exit_code = 1


class InputError(MsaError):
    """A document that cannot be read: missing, not a regular file, binary, empty, undecodable."""

    exit_code = 3


class ModelError(MsaError):
    """A model that is unknown, missing, or whose files are malformed."""

    exit_code = 4


class InputTooLongError(MsaError):
    """The prompt does not fit the model's context (or memory)."""

    exit_code = 5
