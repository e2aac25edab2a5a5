"""Who may call a daemon, and which weight files it may read: ZeroMQ's CURVE and a path check.

A daemon that listens beyond loopback (the point of a cluster) would otherwise serve any caller,
and ``update_weights(path=...)`` would read whatever file it is told to. Given a key pair, the
daemon's socket is a CURVE server (pyzmq's ``zmq.auth``): a client must know the daemon's public
key and hold a key pair whose public half is in the daemon's client-keys folder. Any other client
gets no reply: its handshake fails inside ZeroMQ, so no call of its reaches specactor and it
costs the daemon nothing. Keys are ZeroMQ's own certificate files
(``zmq.auth.create_certificates``, also ``specactor keys``): ``NAME.key`` holds the public key
(give it to the other side), ``NAME.key_secret`` both halves (keep it).

Weight paths: a daemon started with ``--weights-dir`` reads update files only under those
folders (symbolic links resolved first); one that listens beyond loopback without any reads none.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: hosts of a tcp endpoint that only this machine can reach
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})


def is_loopback(endpoint: str) -> bool:
    """Whether only this machine can reach ``endpoint`` (ipc and inproc always; tcp on loopback)."""
    scheme, _, rest = endpoint.partition("://")
    if scheme in ("ipc", "inproc"):
        return True
    if scheme != "tcp":
        return False
    host = rest.rsplit(":", 1)[0]
    return host in LOOPBACK_HOSTS or host.startswith("127.")


def _load(path: Path, secret: bool) -> tuple[bytes, bytes | None]:
    import zmq.auth

    if not path.is_file():
        raise ValueError(f"key file {path}: no such file (specactor keys DIR makes a pair)")
    try:
        public, secret_key = zmq.auth.load_certificate(str(path))
    except (ValueError, OSError) as exc:
        raise ValueError(f"key file {path}: not a ZeroMQ certificate ({exc})") from None
    if secret and secret_key is None:
        raise ValueError(f"key file {path} holds only a public key: give the NAME.key_secret file")
    return public, secret_key


@dataclass(frozen=True)
class ServerKeys:
    """The daemon's key pair (``NAME.key_secret``) and the folder of the clients it serves
    (their ``NAME.key`` files)."""

    secret_file: Path
    client_keys: Path

    def check(self) -> None:
        """ValueError naming a missing or unusable file or folder (before anything starts)."""
        _load(self.secret_file, secret=True)
        if not self.client_keys.is_dir():
            raise ValueError(f"client keys {self.client_keys}: not a folder (it holds the clients' NAME.key files)")
        if not any(self.client_keys.glob("*.key")):
            raise ValueError(f"client keys {self.client_keys}: no NAME.key file in it: no client could call")

    def secure(self, sock: Any) -> Any:
        """Make ``sock`` (before it binds) a CURVE server and start the authenticator that checks
        clients against ``client_keys``; returns the authenticator (stop it when the socket closes)."""
        import zmq
        from zmq.auth.thread import ThreadAuthenticator

        public, secret = _load(self.secret_file, secret=True)
        # ZAP runs in the socket's own ZeroMQ context: a plain context shadowing the asyncio one
        auth = ThreadAuthenticator(zmq.Context.shadow(sock.context.underlying))
        auth.start()
        auth.configure_curve(domain="*", location=str(self.client_keys))
        sock.curve_secretkey, sock.curve_publickey, sock.curve_server = secret, public, True
        return auth


@dataclass(frozen=True)
class ClientKeys:
    """A client's key pair (``NAME.key_secret``) and the daemon's public key (its ``NAME.key``)."""

    secret_file: Path
    server_key: Path

    def secure(self, sock: Any) -> None:
        """Make ``sock`` (before it connects) a CURVE client of that daemon."""
        public, secret = _load(self.secret_file, secret=True)
        server, _ = _load(self.server_key, secret=False)
        sock.curve_secretkey, sock.curve_publickey, sock.curve_serverkey = secret, public, server


def check_endpoint(endpoint: str, keys: ServerKeys | None, insecure: bool) -> None:
    """Refuse to listen beyond loopback with no key pair, unless the caller said ``insecure``."""
    if keys is None and not insecure and not is_loopback(endpoint):
        raise ValueError(f"endpoint {endpoint} can be reached from other machines: give --server-key and "
                         "--client-keys (specactor keys DIR makes key pairs), or --insecure to serve anyone")


def create_keys(folder: str | os.PathLike[str], name: str) -> tuple[Path, Path]:
    """A new key pair in ``folder``: (``NAME.key``, ``NAME.key_secret``), the secret readable by
    its owner only."""
    import zmq.auth

    if not name or any(ch in name for ch in "/\\") or name.startswith("."):
        raise ValueError(f"key name {name!r}: a plain file name, e.g. daemon or trainer")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    public, secret = (folder / f"{name}.key", folder / f"{name}.key_secret")
    if public.exists() or secret.exists():
        raise ValueError(f"{public} or {secret} exists already: keys are never overwritten")
    made_public, made_secret = zmq.auth.create_certificates(str(folder), name)
    os.chmod(made_secret, 0o600)
    return Path(made_public), Path(made_secret)


class WeightPaths:
    """Where ``update_weights(path=...)`` may read: under ``folders`` (resolved), or, with none
    given, anywhere on a loopback daemon and nowhere on one other machines can reach."""

    def __init__(self, folders: list[str | os.PathLike[str]] = (), *, reachable: bool = False) -> None:
        self.folders = [Path(f).resolve() for f in folders]
        self.reachable = reachable

    def check(self, path: str) -> None:
        """ValueError unless the daemon may read ``path``."""
        if not self.folders:
            if self.reachable:
                raise ValueError("this daemon reads no weight files (it listens beyond loopback and was "
                                 "started without --weights-dir): send the weights themselves")
            return
        real = Path(path).resolve()
        if not any(real == f or f in real.parents for f in self.folders):
            raise ValueError(f"weight path {path} is outside the folders this daemon reads updates from "
                             f"({', '.join(map(str, self.folders))}; --weights-dir)")
