"""dedupwire: a message socket that sends only what the peer lacks.

``connect`` and ``listen`` open dedup channels over TCP, encrypted and authenticated with a
``Key`` both ends share (``key=``; plaintext only with ``insecure_plaintext=True`` on both
ends); a ``Stream`` sends and receives whole messages (``bytes``), each verified end to end.
Chunks both ends have seen are kept in a chunk store: an ``Environment`` (a directory on
disk, shared by every stream given it) or, with ``env=None``, an in-memory store. Every
channel error is a ``DedupError``.
"""

from ._dedupwire import (
    DedupError,
    Environment,
    Key,
    Listener,
    Stream,
    __version__,
    connect,
    listen,
)

__all__ = [
    "DedupError",
    "Environment",
    "Key",
    "Listener",
    "Stream",
    "__version__",
    "connect",
    "listen",
]
