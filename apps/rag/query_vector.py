"""The query embedding as a statement parameter in pgvector's binary form: no 384 numbers to
format here and parse on the server."""

from __future__ import annotations

import struct
from functools import cache

import numpy as np
from psycopg.adapt import Dumper
from psycopg.pq import Format
from psycopg.types import TypeInfo


class QueryVector:
    """The query embedding as a statement parameter, sent in pgvector's binary form: no 384
    numbers to format here and parse on the server."""

    __slots__ = ("payload",)

    def __init__(self, embedding) -> None:
        values = np.asarray(embedding, dtype=">f4")  # big-endian float4, as vector_recv reads
        self.payload = struct.pack(">HH", len(values), 0) + values.tobytes()


class _VectorDumper(Dumper):
    format = Format.BINARY

    def dump(self, obj: QueryVector) -> bytes:
        return obj.payload


@cache
def vector_dumper(oid: int) -> type[Dumper]:
    return type("VectorDumper", (_VectorDumper,), {"oid": oid})


def vector_oid(raw) -> int:
    """pgvector's type oid, looked up once per connection (it differs between databases)."""
    info = raw.adapters.types.get("vector")
    if info is None:
        info = TypeInfo.fetch(raw, "vector")
        info.register(raw)
    return info.oid
