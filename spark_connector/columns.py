"""Schemas and the Arrow columns behind them. Pure.

Keys and values are stored as bytes; `string` format means UTF-8 text.
"""

from __future__ import annotations

from typing import Sequence

import pyarrow as pa
from pyspark.sql.types import BinaryType, BooleanType, IntegerType, LongType, StringType, StructField, StructType

from raftkv.core.errors import InvalidRequest

NOT_UTF8 = "a stored key or value is not UTF-8 text; read it with key_format/value_format=binary"


def _spark_type(fmt: str):
    return StringType() if fmt == "string" else BinaryType()


def kv_schema(key_format: str, value_format: str) -> StructType:
    """Batch rows: a key, its value, and where the value was read (partition, applied Raft index)."""
    return StructType([
        StructField("key", _spark_type(key_format)),
        StructField("value", _spark_type(value_format)),
        StructField("partition", IntegerType()),
        StructField("index", LongType()),
    ])


def change_schema(key_format: str, value_format: str) -> StructType:
    """Change-feed rows: one per event; (partition, index, seq) identifies it (the v1 envelope's fields)."""
    return StructType([
        StructField("partition", IntegerType()),
        StructField("index", LongType()),
        StructField("seq", IntegerType()),
        StructField("op", StringType()),
        StructField("key", _spark_type(key_format)),
        StructField("value", _spark_type(value_format)),
        StructField("before", _spark_type(value_format)),
        StructField("term", LongType()),
        StructField("snapshot", BooleanType()),
        StructField("ts_ms", LongType()),
    ])


def to_arrow(values: Sequence[bytes | None], fmt: str) -> pa.Array:
    array = pa.array(values, pa.binary())
    if fmt == "binary":
        return array
    try:
        return array.cast(pa.string())
    except pa.ArrowInvalid:
        raise InvalidRequest(NOT_UTF8) from None


def from_arrow(column: pa.ChunkedArray | pa.Array, what: str) -> list[bytes | None]:
    """A string or binary column as stored bytes."""
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        column = column.cast(pa.binary())
    elif not (pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type)):
        raise InvalidRequest(f"column {what} is {column.type}; write it as string or binary")
    return column.to_pylist()


def binary_column(count: int, offsets: bytes, data: bytes, fmt: str) -> pa.Array:
    """An Arrow array over a scan chunk's columns, without copying (both formats share the layout)."""
    arrow_type = pa.string() if fmt == "string" else pa.binary()
    array = pa.Array.from_buffers(arrow_type, count, [None, pa.py_buffer(offsets), pa.py_buffer(data)])
    if fmt == "string":
        try:
            array.validate(full=True)
        except pa.ArrowInvalid:
            raise InvalidRequest(NOT_UTF8) from None
    return array
