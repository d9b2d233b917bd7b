"""Redis Cluster: telling a cluster's URL apart, its clients, and transactions split by slot.

A cluster is named by `redis+cluster://host:port,host:port/` (or `rediss+cluster://` for TLS):
any reachable node will do, the client learns the rest from it. The same code runs on one node
and on a cluster because every multi-key command and script keeps its keys in one slot:

- a request's keys share its `{request id}` tag, so requests spread across the cluster;
- the dispatcher's keys share `{adm}`, and the fleet's keys (work streams, heartbeats, the
  dead-letter stream) carry a tag that hashes to the same slot, so a dispatcher transaction that
  moves a request from the queue onto a work stream stays in one slot.

What cannot be one slot is a dispatcher transaction that also ends requests: `SlotTransaction`
runs each slot's share as its own MULTI/EXEC, the dispatcher's slot last (see there why).

What this module changes in redis-py, checked against redis-py 6.4 (pyproject pins the minor).
`.venv/bin/python bench/cluster_forks.py --pairs 3` times the two kept for speed with and
without them (on a loaded 2-core box: `stream reads 624 vs 163 pipelines/s, node pipelines 835
vs 756 pipelines/s (0 vs 2573 connections past the bound; one thread 801 vs 1354)`) and lists
which of the others the installed redis-py still needs ("still needs: ...").
- StreamReadSlots, for speed: the output hub's read of 20 streams, 3.8 times as many a second.
- SluicePipeline.execute, one node at a time, for the connection bound under load: 8 threads,
  2 connections per node, 10 % more pipelines a second and none of the 860 connections a second
  opened (and closed) past the bound. A lone thread pays for it, 41 % fewer: each node it
  touches is a round trip of its own.
- NodePool: redis-py's node pools refuse a command past their connections (their
  BlockingConnectionPool waits for ever, see there); https://github.com/redis/redis-py/pull/3359
- AsyncSluiceRedisCluster._execute_command: a redis-py bug, ASKING sent on another connection
  than the command it is for (no upstream issue found).
- SlotTransaction._parsed: a redis-py bug, a cluster MULTI's replies miss the node client's
  response callbacks (no upstream issue found).
- SluicePipeline.eval and .mget: redis-py's cluster pipeline refuses both (scripts:
  https://github.com/redis/redis-py/issues/2914); SluiceRedisCluster.mget: it refuses an MGET
  across slots (its answer is mget_nonatomic, which code written for one node does not call).
"""

from __future__ import annotations

import collections
import threading
from queue import Empty
from urllib.parse import unquote, urlsplit

import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode as AsyncClusterNode
from redis.cluster import ClusterNode, ClusterPipeline, PipelineStrategy, RedisClusterException
from redis.commands.helpers import list_or_args
from redis.crc import key_slot
from redis.utils import str_if_bytes

CLUSTER_SCHEMES = {"redis+cluster": False, "rediss+cluster": True}  # scheme -> TLS
# The slot of the dispatcher's `{adm}` keys: the slot whose transaction commits a pass.
COMMIT_SLOT = key_slot(b"adm")


def is_cluster_url(url: str) -> bool:
    return urlsplit(url).scheme in CLUSTER_SCHEMES


def cluster_url(nodes: list[tuple[str, int]]) -> str:
    return "redis+cluster://" + ",".join(f"{host}:{port}" for host, port in nodes) + "/"


def parse_cluster_url(url: str) -> tuple[list[tuple[str, int]], dict]:
    """The startup nodes `url` names and the options every node connection takes (password,
    TLS). Raises ValueError for a URL that names no node or a database other than 0."""
    parts = urlsplit(url)
    if parts.scheme not in CLUSTER_SCHEMES:
        raise ValueError(f"not a Redis Cluster URL (redis+cluster://host:port,...): {url!r}")
    netloc = parts.netloc.rpartition("@")[2]
    nodes = []
    for item in filter(None, netloc.split(",")):
        host, _, port = item.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"Redis Cluster node must be host:port, got {item!r} in {url!r}")
        nodes.append((host.strip("[]"), int(port)))
    if not nodes:
        raise ValueError(f"Redis Cluster URL names no node: {url!r}")
    if parts.path.strip("/") not in ("", "0"):
        raise ValueError("a Redis Cluster has only database 0")
    options: dict = {}
    userinfo = parts.netloc.rpartition("@")[0] if "@" in parts.netloc else ""
    if userinfo:
        user, _, password = userinfo.partition(":")
        if user:
            options["username"] = unquote(user)
        if password:
            options["password"] = unquote(password)
    if CLUSTER_SCHEMES[parts.scheme]:
        options["ssl"] = True
    return nodes, options


class StreamReadSlots:
    """The slot of an XREAD or XREADGROUP found from its own arguments. redis-py asks a node
    (COMMAND GETKEYS) for every command whose keys move, a round trip and, inside a pipeline
    that already holds a connection, a second connection: the output hub's read of 20 streams
    runs 3.8 times as often without (bench/cluster_forks.py)."""

    def determine_slot(self, *args) -> int:
        if args and str_if_bytes(args[0]).upper() in ("XREAD", "XREADGROUP"):
            words = [str_if_bytes(a).upper() if isinstance(a, str | bytes) else a for a in args]
            if "STREAMS" in words:
                rest = args[words.index("STREAMS") + 1 :]
                slots = {self.keyslot(key) for key in rest[: len(rest) // 2]}
                if len(slots) == 1:
                    return slots.pop()
        return super().determine_slot(*args)


class SluicePipeline(StreamReadSlots, ClusterPipeline):
    """redis-py's cluster pipeline, split by node, that also queues EVAL (each script's keys
    name its slot) and a one-slot MGET, as the code written for one node does."""

    def __init__(self, client: SluiceRedisCluster, *, transaction: bool = False) -> None:
        super().__init__(
            nodes_manager=client.nodes_manager,
            commands_parser=client.commands_parser,
            startup_nodes=client.nodes_manager.startup_nodes,
            result_callbacks=client.result_callbacks,
            cluster_response_callbacks=client.cluster_response_callbacks,
            read_from_replicas=client.read_from_replicas,
            retry=client.retry,
            lock=client._lock,
            transaction=transaction,
        )
        self.client = client

    def eval(self, script, numkeys, *keys_and_args):
        # redis-py's cluster pipeline has no eval (https://github.com/redis/redis-py/issues/2914)
        return self.execute_command("EVAL", script, numkeys, *keys_and_args)

    def mget(self, keys, *args):
        # MGET is on redis-py's PIPELINE_BLOCKED_COMMANDS, even for keys of one slot.
        return self.execute_command("MGET", *list_or_args(keys, args))

    def execute(self, raise_on_error: bool = True) -> list:
        """One node's commands at a time: redis-py's pipeline takes a connection on every node
        it touches before it sends anything, so threads whose pipelines span nodes would hold
        one node's connection while NodePool opens them another past its bound (a thread that
        holds one never waits). 8 threads, 2 connections per node: 10 % more pipelines a second
        and none opened past the bound (bench/cluster_forks.py); a lone thread runs slower."""
        if not isinstance(self._execution_strategy, PipelineStrategy):  # a MULTI: one slot
            return super().execute(raise_on_error=raise_on_error)
        queued = list(self._execution_strategy.command_queue)
        groups = self._by_node(queued)
        if len(groups) < 2:
            return super().execute(raise_on_error=raise_on_error)
        self.reset()
        replies: list = [None] * len(queued)
        for commands in groups:
            pipe = SluicePipeline(self.client)
            for command in commands:
                pipe.execute_command(*command.args, **command.options)
            for command, reply in zip(commands, ClusterPipeline.execute(pipe, False), strict=True):
                replies[command.position] = reply
        if raise_on_error:
            for reply in replies:
                if isinstance(reply, Exception):
                    raise reply
        return replies

    def _by_node(self, queued: list) -> list[list]:
        """The queued commands grouped by the node that owns their slot now (a keyless command
        or one with its own target goes with the first group: redis-py routes it)."""
        groups: dict[str, list] = {}
        for command in queued:
            try:
                if "target_nodes" in command.options:
                    raise RedisClusterException("targeted")
                slot = self.client.determine_slot(*command.args)
                name = self.client.nodes_manager.get_node_from_slot(slot).name
            except (RedisClusterException, IndexError, KeyError):
                name = next(iter(groups), "")
            groups.setdefault(name, []).append(command)
        return list(groups.values())


class SlotTransaction(SluicePipeline):
    """`pipeline(transaction=True)` on a cluster. Redis runs a MULTI in one slot only, so the
    queued commands are grouped by slot and each group runs as its own MULTI/EXEC; replies come
    back in the order the commands were queued, as from one transaction.

    Groups run in the order their slots first appear, except the dispatcher's own slot, which
    runs last: a pass first writes what it does to requests (end one, mark it dispatched) and
    only then takes them off its queue or acknowledges their admission entries. A dispatcher
    dying between the two leaves work to be done again (a request found ended is skipped),
    never a request taken off the queue that nobody will finish."""

    def execute(self, raise_on_error: bool = True) -> list:
        queued = list(self._execution_strategy.command_queue)
        self.reset()
        groups: dict[int, list] = {}
        for command in queued:
            groups.setdefault(self.client.determine_slot(*command.args), []).append(command)
        replies: list = [None] * len(queued)
        for slot in sorted(groups, key=lambda s: s == COMMIT_SLOT):  # stable: first seen first
            pipe = SluicePipeline(self.client, transaction=True)
            for command in groups[slot]:
                pipe.execute_command(*command.args, **command.options)
            for command, reply in zip(
                groups[slot], pipe.execute(raise_on_error=False), strict=True
            ):
                replies[command.position] = self._parsed(command, reply)
        if raise_on_error:
            for reply in replies:
                if isinstance(reply, Exception):
                    raise reply
        return replies

    def _parsed(self, command, reply):
        # redis-py's cluster transactions apply only the cluster callbacks, so an HGETALL in
        # a MULTI comes back as a flat list; the node client's callbacks make it a dict again.
        # Still so in redis-py 6.4 (TransactionStrategy._execute_transaction); no upstream issue.
        name = command.args[0]
        if isinstance(reply, Exception) or name in self.cluster_response_callbacks:
            return reply
        callback = self.client.get_default_node().redis_connection.response_callbacks.get(name)
        options = {k: v for k, v in command.options.items() if k != "keys"}
        return callback(reply, **options) if callback else reply


class SluiceRedisCluster(StreamReadSlots, redis.RedisCluster):
    """redis-py's cluster client whose transactions may span slots (see SlotTransaction)."""

    def pipeline(self, transaction=None, shard_hint=None):
        if shard_hint:
            raise ValueError("shard_hint has no meaning on a cluster")
        return SlotTransaction(self) if transaction else SluicePipeline(self)

    def mget(self, keys, *args):
        # Keys of several slots: one MGET per slot, the values in the order asked.
        return self.mget_nonatomic(keys, *args)


class NodePool(redis.BlockingConnectionPool):
    """At most `max_connections` to one node, opened as commands overlap; a caller past them
    waits for a free one (redis-py's own cluster pool fails it instead; upstream's answer is a
    BlockingConnectionPool, https://github.com/redis/redis-py/pull/3359, which alone would wait
    for ever in the case below).

    A thread that already holds a connection of a NodePool never waits: redis-py's recovery
    (rereading the slot map after MOVED or a lost node) asks for a second connection while it
    holds the first, and two threads doing that at once would each wait for the other's. It
    gets a free connection, or one past the bound that is closed when released. Pipelines
    take one node at a time (SluicePipeline.execute) and stream reads name their own slot
    (StreamReadSlots), so under plain load this does not happen: only while the cluster changes,
    or for a command whose keys redis-py must ask a node for."""

    _held = threading.local()  # connections of any NodePool the current thread holds

    def __init__(self, *, wait_timeout: float = 30, **options) -> None:
        super().__init__(timeout=wait_timeout, **options)

    def get_connection(self, *args, **options):
        held = getattr(self._held, "count", 0)
        try:
            connection = super().get_connection() if not held else self._free_or_extra()
        except BaseException:
            self._held.count = held
            raise
        self._held.count = held + 1
        return connection

    def release(self, connection) -> None:
        self._held.count = max(0, getattr(self._held, "count", 1) - 1)
        self._put_back(connection)

    def _free_or_extra(self):
        self._checkpid()
        try:
            connection = self.pool.get_nowait()
        except Empty:
            connection = self.connection_class(**self.connection_kwargs)
            connection.sluice_extra = True
        if connection is None:
            connection = self.make_connection()
        try:
            connection.connect()
            if connection.can_read():  # a reply nobody read: start afresh
                connection.disconnect()
                connection.connect()
        except BaseException:
            self._put_back(connection)
            raise
        return connection

    def _put_back(self, connection) -> None:
        if getattr(connection, "sluice_extra", False):
            connection.disconnect()
        else:
            super().release(connection)


class _NodePoolFactory:
    """What redis-py's NodesManager calls to build a node's pool (`connection_pool_class`)."""

    def __init__(self, per_node: int, wait_timeout: float) -> None:
        self.per_node, self.wait_timeout = per_node, wait_timeout

    def __call__(self, **options) -> NodePool:
        options.pop("max_connections", None)
        if options.pop("ssl", False):  # the URL's TLS, as redis-py's node clients take it
            options["connection_class"] = redis.SSLConnection
        return NodePool(max_connections=self.per_node, wait_timeout=self.wait_timeout, **options)


def sync_client(
    url: str, *, max_connections: int, timeout: float, connect_timeout: float, **options
) -> SluiceRedisCluster:
    """A cluster client with at most `max_connections` per node, opened as commands overlap;
    past them a command waits for a free connection (NodePool)."""
    nodes, url_options = parse_cluster_url(url)
    first, first_port = nodes[0]
    # redis-py builds a node's pool with `connection_pool_class` only when given a URL: the
    # first node's (the others are startup nodes too), credentials and TLS as options.
    return SluiceRedisCluster(
        url=f"redis://{f'[{first}]' if ':' in first else first}:{first_port}",
        startup_nodes=[ClusterNode(host, port) for host, port in nodes],
        connection_pool_class=_NodePoolFactory(max_connections, max(30, 3 * timeout)),
        max_connections=max_connections,
        socket_timeout=timeout,
        socket_connect_timeout=connect_timeout,
        **url_options,
        **options,
    )


class AsyncSluicePipeline(aioredis.cluster.ClusterPipeline):
    """The asyncio cluster pipeline, with the queue of commands where a plain pipeline has it
    (the worker's command batcher slices its replies by it)."""

    @property
    def command_stack(self) -> list:
        return self._execution_strategy._command_queue


class _LastFreeFirst(collections.deque):
    """A node's free connections, the one released last handed out first."""

    def popleft(self):
        return self.pop()


class AsyncSluiceRedisCluster(aioredis.RedisCluster):
    def pipeline(self, transaction=None, shard_hint=None):
        if shard_hint:
            raise ValueError("shard_hint has no meaning on a cluster")
        return AsyncSluicePipeline(self, transaction)

    async def _execute_command(self, target_node, *args, **kwargs):
        # On ASK (a slot half migrated) redis-py sends ASKING and then the command, each on a
        # connection taken from the node's free list, oldest first: with two free, the command
        # goes without ASKING, is sent back with MOVED, and the loop ends "TTL exhausted". Free
        # connections handed out newest first make the command follow ASKING on its connection
        # (nothing else runs on the loop between the two). Still so in redis-py 6.4; no upstream
        # issue found (bench/cluster_forks.py checks it).
        for node in self.nodes_manager.nodes_cache.values():
            if type(node._free) is collections.deque:
                node._free = _LastFreeFirst(node._free)
        return await super()._execute_command(target_node, *args, **kwargs)


def async_client(
    url: str,
    *,
    socket_timeout: float,
    connect_timeout: float,
    max_connections: int = 2**31,
    **options,
) -> AsyncSluiceRedisCluster:
    """An asyncio cluster client. redis-py's asyncio cluster fails a command past
    `max_connections` per node rather than waiting, so the default leaves it to the caller's
    own concurrency (a worker's slots) to bound its connections."""
    nodes, url_options = parse_cluster_url(url)
    return AsyncSluiceRedisCluster(
        startup_nodes=[AsyncClusterNode(host, port) for host, port in nodes],
        socket_timeout=socket_timeout,
        socket_connect_timeout=connect_timeout,
        max_connections=max_connections,
        **url_options,
        **options,
    )
