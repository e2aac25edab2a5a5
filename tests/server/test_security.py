"""Across hosts, only those who hold the key: a daemon beyond loopback refuses to start without a
key pair (or --insecure); with one, a client without a valid key gets no reply and the right key
is served; update files are read only from the folders the daemon was started with."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from specactor.server.client import RemoteError, RolloutClient
from specactor.server.security import (ClientKeys, ServerKeys, WeightPaths, check_endpoint, create_keys,
                                       is_loopback)


@pytest.mark.parametrize("endpoint, local", [("tcp://127.0.0.1:5557", True), ("tcp://localhost:0", True),
                                             ("tcp://[::1]:5557", True), ("ipc:///tmp/x", True),
                                             ("tcp://0.0.0.0:5557", False), ("tcp://*:5557", False),
                                             ("tcp://10.1.2.3:5557", False), ("udp://127.0.0.1:1", False)])
def test_only_loopback_and_ipc_count_as_this_machine(endpoint: str, local: bool) -> None:
    assert is_loopback(endpoint) is local


def test_a_reachable_endpoint_needs_a_key_pair_or_insecure(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="other machines.*--server-key.*--insecure"):
        check_endpoint("tcp://0.0.0.0:5557", None, insecure=False)
    check_endpoint("tcp://0.0.0.0:5557", None, insecure=True)
    check_endpoint("tcp://127.0.0.1:5557", None, insecure=False)


def test_keys_are_made_once_with_the_secret_for_its_owner_only(tmp_path: Path) -> None:
    public, secret = create_keys(tmp_path, "daemon")
    assert public.name == "daemon.key" and secret.name == "daemon.key_secret"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    with pytest.raises(ValueError, match="never overwritten"):
        create_keys(tmp_path, "daemon")
    with pytest.raises(ValueError, match="plain file name"):
        create_keys(tmp_path, "../elsewhere")


def test_unusable_key_files_are_named(tmp_path: Path) -> None:
    public, secret = create_keys(tmp_path / "server", "daemon")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no such file"):
        ServerKeys(tmp_path / "nope.key_secret", tmp_path / "empty").check()
    with pytest.raises(ValueError, match="only a public key"):
        ServerKeys(public, tmp_path / "server").check()
    with pytest.raises(ValueError, match="no NAME.key file"):
        ServerKeys(secret, tmp_path / "empty").check()
    (tmp_path / "junk.key_secret").write_text("not a certificate")
    with pytest.raises(ValueError, match="not a ZeroMQ certificate"):
        ServerKeys(tmp_path / "junk.key_secret", tmp_path / "server").check()


def test_weight_paths_stay_inside_the_folders_given(tmp_path: Path) -> None:
    allowed, other = tmp_path / "ckpt", tmp_path / "private"
    allowed.mkdir()
    other.mkdir()
    (allowed / "escape").symlink_to(other)
    paths = WeightPaths([allowed], reachable=True)
    paths.check(str(allowed / "step-3"))
    for outside in (other / "step-3", allowed / ".." / "private", allowed / "escape" / "x"):
        with pytest.raises(ValueError, match="outside the folders"):
            paths.check(str(outside))
    with pytest.raises(ValueError, match="reads no weight files"):
        WeightPaths([], reachable=True).check(str(allowed))
    WeightPaths([], reachable=False).check(str(other))  # a loopback daemon, as before


def test_serve_refuses_a_reachable_endpoint_without_keys_before_loading_anything(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "specactor", "serve", "--endpoint", "tcp://0.0.0.0:0"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--server-key" in done.stderr and "--insecure" in done.stderr, done.stderr
    done = subprocess.run([sys.executable, "-m", "specactor", "serve", "--server-key", str(tmp_path / "x")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "go together" in done.stderr, done.stderr


@pytest.fixture(scope="module")
def keyed(daemon_factory, tmp_path_factory):
    """A daemon with a key pair, serving the clients whose keys are in its folder ('trainer' is,
    'stranger' is not), reading updates only from one folder."""
    root = tmp_path_factory.mktemp("keys")
    _, server_secret = create_keys(root / "server", "daemon")
    create_keys(root / "clients", "trainer")
    create_keys(root / "others", "stranger")
    weights = root / "weights"
    weights.mkdir()
    daemon = daemon_factory("--mode", "autoregressive", "--server-key", str(server_secret),
                            "--client-keys", str(root / "clients"), "--weights-dir", str(weights))
    return daemon, root


async def test_the_right_key_is_served_and_a_missing_or_wrong_one_gets_no_reply(keyed) -> None:
    daemon, root = keyed
    server_public = root / "server" / "daemon.key"
    trainer = ClientKeys(root / "clients" / "trainer.key_secret", server_public)
    async with RolloutClient(daemon.endpoint, keys=trainer, timeout_s=30) as client:
        assert (await client.health())["clients"] >= 0
    stranger = ClientKeys(root / "others" / "stranger.key_secret", server_public)
    for keys in (None, stranger):
        async with RolloutClient(daemon.endpoint, keys=keys, timeout_s=2) as client:
            with pytest.raises(TimeoutError):
                await client.health()
    async with RolloutClient(daemon.endpoint, keys=trainer, timeout_s=30) as client:  # still served
        assert "clients" in await client.health()


async def test_a_keyed_daemon_reads_updates_only_from_its_folders(keyed, tmp_path: Path) -> None:
    daemon, root = keyed
    trainer = ClientKeys(root / "clients" / "trainer.key_secret", root / "server" / "daemon.key")
    async with RolloutClient(daemon.endpoint, keys=trainer, timeout_s=30) as client:
        with pytest.raises(RemoteError, match="outside the folders"):
            await client.update_weights(path=str(tmp_path))
        with pytest.raises(RemoteError, match="outside the folders"):
            await client.update_weights(path=os.path.join(root / "weights", "..", "others"))
