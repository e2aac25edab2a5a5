"""Actor addresses: which transport, and where an actor's inbox binds.

``inproc`` works only between actors of one process (one ZeroMQ context);
``ipc`` (Unix domain sockets) between processes of one machine; ``tcp``
over TCP. TCP binds to loopback unless ``ActorSystem(host=...)`` names another
interface, so nothing is exposed to the network by accident. Every actor is
this process or a child process of it: nothing starts actors on other machines.
"""

from __future__ import annotations

import enum
import os
import re
import tempfile
import uuid

_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")


class Transport(enum.StrEnum):
    INPROC = "inproc"
    IPC = "ipc"
    TCP = "tcp"


def check_name(name: str) -> str:
    """Actor names are short identifiers; they travel as the sender frame."""
    if not _NAME.match(name):
        raise ValueError(
            f"actor name {name!r} is invalid: use 1-64 letters, digits, '_', '.', '-'"
        )
    return name


def transport_of(address: str) -> Transport:
    """The transport of a ZeroMQ address; ValueError for anything else."""
    scheme, sep, rest = address.partition("://")
    if not sep or not rest:
        raise ValueError(f"address {address!r} is not of the form SCHEME://WHERE")
    try:
        return Transport(scheme)
    except ValueError:
        raise ValueError(
            f"address {address!r}: transport {scheme!r} is not one of inproc, ipc, tcp"
        ) from None


class AddressAllocator:
    """Hands out bind addresses for one actor system.

    TCP uses port wildcards (``tcp://127.0.0.1:*``): the actor reports the
    port it actually got in its Ready message.
    """

    def __init__(self, transport: Transport | str, host: str = "127.0.0.1") -> None:
        self.transport = Transport(transport)
        self.host = host
        self.system_id = uuid.uuid4().hex[:10]
        self._ipc_dir: str | None = None

    @property
    def ipc_dir(self) -> str:
        if self._ipc_dir is None:
            # Unix socket paths are limited to ~107 bytes: keep them short.
            self._ipc_dir = tempfile.mkdtemp(prefix="sa-", dir="/tmp" if os.path.isdir("/tmp") else None)
        return self._ipc_dir

    def allocate(self, name: str, generation: int = 0) -> str:
        """``generation``: how many times ``name`` was started before. A restarted actor gets an
        endpoint of its own: inproc peers are not reconnected to a new binder of the same name, and
        a closing ipc socket may unlink its path after the new one has bound it."""
        check_name(name)
        suffix = f"-{generation}" if generation else ""
        if self.transport is Transport.INPROC:
            return f"inproc://specactor-{self.system_id}-{name}{suffix}"
        if self.transport is Transport.IPC:
            return f"ipc://{self.ipc_dir}/{name}{suffix}"
        return f"tcp://{self.host}:*"

    def cleanup(self) -> None:
        if self._ipc_dir is not None:
            for entry in os.listdir(self._ipc_dir):
                try:
                    os.unlink(os.path.join(self._ipc_dir, entry))
                except OSError:
                    pass
            try:
                os.rmdir(self._ipc_dir)
            except OSError:
                pass
            self._ipc_dir = None
