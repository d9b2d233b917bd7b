"""What both sides of Redis agree on. The web, the dispatcher and the workers meet only in
Redis, and this package is everything they must read and write there alike: every key name
(`keys.py`), the messages, states and protocol versions (`protocol.py`, and `embed_protocol.py`
for retrieval work), the one writer of a request's state with its Lua scripts (`transitions.py`,
`transition_scripts.py`), what a worker announces its engine can serve (`capabilities.py`) and
the Redis Cluster client (`cluster.py`), with the few habits every process shares (one log
format, stopping a task without losing the stopper's cancellation, the collector's settings).
It imports nothing of Django and nothing else of Sluice, so `worker/` and the Django side
(`core/`, the apps) stand on it side by side and neither needs the other.
"""
