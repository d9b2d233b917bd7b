"""Every Redis name Sluice uses, under one prefix: the contract's key names (contract/protocol.py
re-exports `Keys`). Every per-request key carries the request id in a `{hash tag}`, so on a Redis
Cluster all of a request's keys share one slot; the dispatcher's own keys share the `{adm}` tag.
No module builds a key name by hand."""

from __future__ import annotations

from dataclasses import dataclass

# The hash tag of the fleet's keys (work streams, heartbeats, dead letters). It hashes to the same
# Redis Cluster slot as `{adm}` (CRC16 slot 5822), so a dispatcher transaction that takes a request
# off its queue and puts it on a work stream, or a worker's one read over several work streams,
# stays in one slot; the name keeps them apart from the dispatcher's own `{adm}` keys.
FLEET_TAG = "fleet-7048"


@dataclass(frozen=True)
class Keys:
    """Every Redis name Sluice uses, under one prefix (tests give each test its own)."""

    prefix: str = "sluice"

    # -- one request's keys: the request id is their hash tag ---------------------------------

    def request(self, request_id: str) -> str:
        """Hash: the request's state, owner, current attempt, citations (see transitions)."""
        return f"{self.prefix}:req:{{{request_id}}}"

    def output(self, request_id: str) -> str:
        """Stream: the events readers follow (status, start, delta, final)."""
        return f"{self.prefix}:out:{{{request_id}}}"

    def cancel(self, request_id: str) -> str:
        return f"{self.prefix}:cancel:{{{request_id}}}"

    def conversation_active(self, conversation_id: int | str) -> str:
        """The request currently answering in a conversation, so a new tab can resume it."""
        return f"{self.prefix}:conv:{{{conversation_id}}}:active"

    @property
    def account_events(self) -> str:
        """Stream: account changes that end sessions (logout, password change, deactivation),
        each naming its user; every web process follows it once for all its open sockets."""
        return f"{self.prefix}:account-events"

    # -- work and workers: their tag hashes to the slot of `{adm}` (FLEET_TAG) ------------------

    def _fleet(self, name: str) -> str:
        return f"{self.prefix}:{{{FLEET_TAG}}}:{name}"

    @property
    def work(self) -> str:
        """The shared work stream: any worker with a free slot takes from it."""
        return self._fleet("work")

    def work_for(self, worker_id: str) -> str:
        """A worker's affinity stream: work routed to it because its KV cache holds the prefix."""
        return self._fleet(f"work:{worker_id}")

    def work_for_model(self, model: str) -> str:
        """A model's shared stream: any worker serving `model` takes from it. Work that names
        no model ("") goes to the shared stream, which every worker reads. Outside `work:`,
        so no worker id can name the same stream."""
        return self._fleet(f"model-work:{model}") if model else self.work

    def is_model_work(self, stream: str) -> bool:
        """Whether `stream` is a model's shared work stream (see work_for_model)."""
        return stream.startswith(self._fleet("model-work:"))

    @property
    def models(self) -> str:
        """Hash: model name → when a worker last said it serves it (ms), so a model with no
        live worker right now is told apart from one that exists nowhere."""
        return self._fleet("models")

    @property
    def dead(self) -> str:
        """Stream: what could not be parsed, stored or run, each entry with its reason."""
        return self._fleet("dead")

    # -- retrieval models on the fleet (worker/embedding.py): the same hash tag ------------------

    def embed_work(self, model: str) -> str:
        """Stream: texts to embed (or passages to score) with `model`, read by the workers
        serving it (consumer group EMBED_GROUP)."""
        return self._fleet(f"embed-work:{model}")

    @property
    def embedders(self) -> str:
        """Hash: retrieval model name → when a worker last said it serves it (ms)."""
        return self._fleet("embedders")

    def embedder(self, worker_id: str) -> str:
        """An embedding worker's liveness key (a TTL of three beats): its model and batches."""
        return self._fleet(f"embedder:{worker_id}")

    def embed_replies(self, process: str) -> str:
        """Stream: a web process's embedding replies, read by its one reply reader
        (apps/rag/fleet.py); `process` is its tag, so it has a slot of its own."""
        return f"{self.prefix}:embed-replies:{{{process}}}"

    # -- the fleet's names before they shared a hash tag: only read, to move what they hold ----

    @property
    def legacy_work(self) -> str:
        return f"{self.prefix}:work"

    @property
    def legacy_work_pattern(self) -> str:
        """Matches the old affinity streams (`work:<worker id>`)."""
        return f"{self.prefix}:work:*"

    @property
    def legacy_dead(self) -> str:
        return f"{self.prefix}:dead"

    @property
    def legacy_move_lock(self) -> str:
        """Held by the one worker moving entries from the old names (worker/legacy_keys.py)."""
        return self._fleet("legacy-move")

    @property
    def workers(self) -> str:
        """Sorted set of worker ids by last heartbeat time (the heartbeat keys hold the detail)."""
        return self._fleet("workers")

    def heartbeat(self, worker_id: str) -> str:
        return self._fleet(f"worker:{worker_id}")

    def reclaim_lock(self, worker_id: str) -> str:
        return self._fleet(f"reclaim:{worker_id}")

    # -- the dispatcher's own keys: one hash tag, so its transactions stay in one slot ---------

    def _adm(self, name: str) -> str:
        return f"{self.prefix}:{{adm}}:{name}"

    @property
    def admit(self) -> str:
        """Stream: new requests, read by the dispatcher."""
        return self._adm("admit")

    @property
    def done(self) -> str:
        """Stream: answer records, read by the recorder (stores them) and the dispatcher."""
        return self._adm("done")

    @property
    def lease(self) -> str:
        return self._adm("lease")

    @property
    def queue(self) -> str:
        """Hash: request id → JSON of a queued request (the authoritative queue)."""
        return self._adm("queue")

    @property
    def charges(self) -> str:
        """Hash: request id → JSON of what its buckets were charged, until reconciled."""
        return self._adm("charges")

    @property
    def running(self) -> str:
        """Hash: request id → "user|dispatched ms" for requests on workers (max_concurrent)."""
        return self._adm("running")

    @property
    def cancels(self) -> str:
        """Set: ids of requests whose user pressed stop, emptied by the dispatcher's sweep. It
        finds a waiting request's stop at once, wherever it is in a long queue."""
        return self._adm("cancels")

    @property
    def degradation(self) -> str:
        return self._adm("degradation")

    def process_cpu(self) -> str:
        """Hash: Sluice process ("web:host:pid") → "percent ms", its own CPU share (one core
        = 100) and when it was measured; each web process writes its field every few seconds,
        the dispatcher reads them for degradation and drops stale ones. The key has a TTL."""
        return self._adm("process-cpu")

    @property
    def metrics(self) -> str:
        return self._adm("metrics")

    @property
    def series(self) -> str:
        """Stream: one sample of throughput and latency every few seconds (the ops page)."""
        return self._adm("series")

    @property
    def ops_state(self) -> str:
        """JSON the dispatcher refreshes every few seconds for the ops page: the line's
        summary, the workers it has seen, the heaviest users, rolling figures."""
        return self._adm("ops")

    def bucket(self, user_id: str) -> str:
        return self._adm(f"bucket:{user_id}")

    def affinity(self, kind: str, name: str) -> str:
        """The worker whose KV cache holds a "conv" or a "prefix" (apps/admission/affinity)."""
        return self._adm(f"affinity:{kind}:{name}")

    def estimates(self, part: str) -> str:
        """The dispatcher's learned state: answer lengths, leans, errors, service times."""
        return self._adm(f"est:{part}")

    # -- the web's keys ---------------------------------------------------------------------------

    def background_in_flight(self, task: str, owner: int | str) -> str:
        """One background task of a kind in flight per conversation (or user)."""
        return f"{self.prefix}:bg:{{{task}:{owner}}}"

    @property
    def inbox_events(self) -> str:
        """Stream: new inbox messages, each naming its user ("*": every user); every web process
        follows it once for all its open inbox sockets."""
        return f"{self.prefix}:inbox-events"

    @property
    def api_callers_token(self) -> str:
        """The API callers cache's generation: a key or plan change bumps it."""
        return f"{self.prefix}:{{api-callers}}:token"

    def api_caller(self, digest: str) -> str:
        """The cached caller (user and plan rows) of the API key whose SHA-256 is `digest`."""
        return f"{self.prefix}:{{api-callers}}:{digest}"

    # -- login throttling and the retrieval cache --------------------------------------------------

    def login_failures(self, digest: str) -> str:
        return f"{self.prefix}:login-failures:{digest}"

    def rag_cache(self, kind: str, digest: str) -> str:
        return f"{self.prefix}:rag:{kind}:{digest}"
