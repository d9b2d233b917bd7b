"""Sluice's worker: pulls generations from Redis Streams and runs them on an engine.

Never imports Django: a GPU box needs only Redis and the model.
"""
