"""The prefix cache's own secret: block and token files are named by a keyed hash of their
content key, so that someone who can list the cache but not read the secret cannot confirm
offline that a guessed document was read (content hashes alone can be recomputed by anyone).

    secret    32 random bytes, 0600, made once by the first process that writes the cache
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import tempfile
from pathlib import Path

from msa.models.private_files import FILE_MODE, private_dir

SECRET_BYTES = 32


def cache_secret(root: Path, *, create: bool) -> bytes | None:
    """The secret of the cache at `root`, made now if there is none and `create` (None when
    there is none to read). A secret file that is not one is replaced: the blocks named by it
    are then simply never found, and recomputed. OSError if it cannot be made."""
    path = Path(root) / "secret"
    secret = _read(path)
    if secret is not None or not create:
        return secret
    private_dir(path.parent)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".secret.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(os.urandom(SECRET_BYTES))
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, FILE_MODE)
        try:
            os.link(tmp, path)  # never over another process's secret made meanwhile
        except FileExistsError:
            if _read(path) is None:  # damaged: replace it
                os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return _read(path)


def _read(path: Path) -> bytes | None:
    try:
        data = path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        return None
    return data if len(data) == SECRET_BYTES else None


def keyed_name(secret: bytes, content_key: bytes) -> str:
    """The hex name of a file holding what `content_key` names, under the cache's secret."""
    return hmac.new(secret, content_key, hashlib.sha256).hexdigest()
