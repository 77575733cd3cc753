"""The `raftkv` Spark data source: batch read and write of the store, and its change feed.

    spark.read.format("raftkv").option("endpoints", "127.0.0.1:7000").load()
    df.write.format("raftkv").option("endpoints", ...).mode("append").save()
    spark.readStream.format("raftkv").option("changelog", "127.0.0.1:7400").load()

With a `changelog` option the rows are change events, else key/value rows.
"""

from __future__ import annotations

from pyspark.sql.datasource import DataSource

from raftkv.core.errors import ConfigError
from spark_connector.batch_read import KVReader
from spark_connector.batch_write import KVWriter
from spark_connector.change_feed import ChangeFeedBatchReader, ChangeFeedStreamReader
from spark_connector.columns import change_schema, kv_schema
from spark_connector.options import ConnectorOptions, parse_options


class RaftKVDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "raftkv"

    def _options(self) -> ConnectorOptions:
        return parse_options(self.options)

    def schema(self):
        opts = self._options()
        build = change_schema if opts.changelog else kv_schema
        return build(opts.key_format, opts.value_format)

    def reader(self, schema):
        opts = self._options()
        return ChangeFeedBatchReader(opts) if opts.changelog else KVReader(opts)

    def writer(self, schema, overwrite: bool):
        return KVWriter(self._options(), overwrite)

    def streamReader(self, schema):
        opts = self._options()
        if not opts.changelog:
            raise ConfigError("option changelog is missing: a stream reads the change feed from a learner running "
                              "--sink changelog; give changelog=HOST:PORT (its --api-port)", source="raftkv connector")
        return ChangeFeedStreamReader(opts)
