"""Sluice's worker: pulls work items (requests) from Redis Streams and runs them on an engine.

Never imports Django: a GPU box needs only Redis and the model.
"""
