from os import PathLike
from types import TracebackType
from typing import Any, ClassVar, Dict, Literal, Optional, Sequence, Tuple, Type, Union, final

__version__: str
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

_Address = Union[str, Tuple[str, int]]
_Mode = Literal["adaptive", "dedup", "plain"]
_Path = Union[str, "PathLike[str]"]

class DedupError(Exception):
    """An error of the dedup channel or its chunk store; the message is the Rust error's."""

@final
class Key:
    """The key both ends of a channel share (32 bytes); its ``repr`` shows only its public id."""

    @staticmethod
    def generate() -> "Key": ...
    @staticmethod
    def load(path: _Path) -> "Key": ...
    @staticmethod
    def from_text(text: str) -> "Key": ...
    def save(self, path: _Path) -> None: ...
    def hex(self) -> str: ...
    @property
    def id(self) -> str: ...
    def __eq__(self, value: object, /) -> bool: ...
    __hash__: ClassVar[None]  # type: ignore[assignment]

_KeyArg = Union[Key, str]

@final
class Environment:
    """A persistent, size-bounded chunk store in a directory, shared by every stream given it."""

    def __new__(
        cls,
        path: _Path,
        max_bytes: Optional[int] = None,
        segment_bytes: Optional[int] = None,
    ) -> "Environment": ...
    @property
    def path(self) -> str: ...
    def stats(self) -> Dict[str, int]: ...
    def sync(self) -> None: ...

@final
class Stream:
    """A deduplicating message channel: ``send`` a message, ``recv`` one."""

    def send(self, data: bytes) -> None: ...
    def recv(self) -> bytes: ...
    def close(self) -> None: ...
    @property
    def closed(self) -> bool: ...
    @property
    def config(self) -> Dict[str, Any]: ...
    @property
    def encrypted(self) -> bool: ...
    @property
    def peer_address(self) -> Optional[Tuple[str, int]]: ...
    def stats(self) -> Dict[str, Union[int, float]]: ...
    def __enter__(self) -> "Stream": ...
    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None: ...

@final
class Listener:
    """Accepts dedup channels on a TCP port, all sharing one chunk store."""

    @property
    def address(self) -> Tuple[str, int]: ...
    @property
    def closed(self) -> bool: ...
    @property
    def encrypted(self) -> bool: ...
    def accept(self) -> Stream: ...
    def close(self) -> None: ...
    def __enter__(self) -> "Listener": ...
    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None: ...

def listen(
    addr: _Address,
    *,
    key: Optional[_KeyArg] = None,
    insecure_plaintext: bool = False,
    env: Optional[Environment] = None,
) -> Listener: ...
def connect(
    addr: _Address,
    *,
    key: Optional[_KeyArg] = None,
    insecure_plaintext: bool = False,
    env: Optional[Environment] = None,
    mode: _Mode = "adaptive",
    levels: Optional[Sequence[int]] = None,
    segment_size: Optional[int] = None,
) -> Stream: ...
