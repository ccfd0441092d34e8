"""The project's own errors. The library raises them; the CLI turns each into one line and an
exit code."""

import errno


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


class DiskError(MsaError):
    """A file msa must write (or read back) cannot be: the disk is full, read-only, or the
    file or folder is not ours to change."""

    exit_code = 7


_DISK_REASONS = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
}
DISK_ERRNOS = frozenset(_DISK_REASONS)


def disk_error(error: OSError, doing: str) -> DiskError:
    """`error` as one line: what msa was `doing` ("writing /x/y"), then why."""
    reason = _DISK_REASONS.get(error.errno) or error.strerror or str(error)
    return DiskError(f"{doing}: {reason}")
