"""Errors of the prefix cache's commands (an `ask` never fails because of its cache)."""

from msa.models.errors import MsaError


class CacheError(MsaError):
    """A cache command or setting given a bad value: an unknown entry, a size that is not a size."""

    exit_code = 2


class CacheBusyError(CacheError):
    """Another msa process held the cache's lock for too long."""

    exit_code = 1
