"""Sluice's worker: pulls work items (requests) from Redis Streams and runs them on an engine.

Never imports Django: a GPU box needs only Redis, the model and
`contract/`, what the worker and the web agree on in Redis.
"""
