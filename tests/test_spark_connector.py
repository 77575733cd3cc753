"""The `raftkv` Spark data source against real node processes and a real local Spark."""

from __future__ import annotations

import hashlib
import secrets
import sys
import threading
from pathlib import Path

import pytest

from raftkv.client.sync_client import Client
from raftkv.core.commands import Put
from raftkv.core.partitioning import partition_for_key
from raftkv.meta.access import GrantPermission, Permission, PutUser, UserRecord
from tests.conftest import changelog_caught_up, wait_until
from tests.spark_session import start_spark


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    session = start_spark(str(tmp_path_factory.mktemp("warehouse")))
    yield session
    session.stop()


@pytest.fixture
def cluster(make_cluster):
    return make_cluster(nodes=3, partitions=4)


def endpoints(cluster) -> str:
    return ",".join(cluster.endpoints)


def reader(spark, cluster, **options):
    r = spark.read.format("raftkv").option("endpoints", endpoints(cluster))
    for name, value in options.items():
        r = r.option(name, value)
    return r.load()


def test_write_100k_rows_then_read_them_back_with_spark_and_the_client(spark, cluster):
    rows = 100_000
    df = spark.range(rows).selectExpr("format_string('k%06d', id) AS key", "format_string('v%d', id * 7) AS value")
    (df.write.format("raftkv").option("endpoints", endpoints(cluster))
       .option("key_format", "string").option("value_format", "string").mode("append").save())

    read = reader(spark, cluster, key_format="string", value_format="string")
    got = {r.key: r.value for r in read.select("key", "value").collect()}
    expected = {f"k{i:06d}": f"v{i * 7}" for i in range(rows)}
    assert got == expected
    with Client(cluster.endpoints) as client:
        assert {k.decode(): v.decode() for k, v in client.scan()} == expected


def test_each_partition_is_read_from_one_snapshot_and_says_which(spark, cluster):
    with Client(cluster.endpoints) as client:
        for i in range(200):
            client.put(f"key{i}", f"value{i}")
    rows = reader(spark, cluster, key_format="string", value_format="string").collect()
    assert len(rows) == 200
    for row in rows:
        assert row.partition == partition_for_key(row.key.encode(), 4)
    per_partition = {}
    for row in rows:
        per_partition.setdefault(row.partition, set()).add(row["index"])
    assert {p: len(indexes) for p, indexes in per_partition.items()} == {0: 1, 1: 1, 2: 1, 3: 1}
    assert all(min(indexes) > 0 for indexes in per_partition.values()), per_partition


def test_a_large_partition_is_read_as_several_key_ranges(spark, cluster):
    keys = [f"key{i:04d}" for i in range(400)]
    expected = {k for k in keys if partition_for_key(k.encode(), 4) == 0 or k < "key0100"}
    with Client(cluster.endpoints) as client:
        for k in expected:
            client.put(k, k)
    in_zero = sum(partition_for_key(k.encode(), 4) == 0 for k in keys)
    df = reader(spark, cluster, key_format="string", value_format="string", split_rows=30)
    assert df.rdd.getNumPartitions() == (in_zero - 1) // 30 + 1 + 3
    assert sorted(r.key for r in df.collect()) == sorted(expected)


def physical_plan(df, capsys) -> str:
    df.explain()
    return capsys.readouterr().out


def test_key_filters_are_pushed_down_and_key_equality_reads_one_partition(spark, cluster, capsys):
    with Client(cluster.endpoints) as client:
        for i in range(100):
            client.put(f"key{i:03d}", f"value{i}")
    df = reader(spark, cluster, key_format="string", value_format="string")

    one = df.filter("key = 'key042'")
    assert "Filter (" not in physical_plan(one, capsys)  # raftkv applied it; Spark does not filter again
    assert one.rdd.getNumPartitions() == 1
    assert [(r.key, r.value) for r in one.collect()] == [("key042", "value42")]
    # a filter the source cannot apply stays in Spark's plan
    assert "Filter (" in physical_plan(df.filter("value = 'value42'"), capsys)

    some = df.filter("key IN ('key001', 'key002', 'nope')")
    assert "Filter (" not in physical_plan(some, capsys)
    assert some.rdd.getNumPartitions() == len({partition_for_key(k, 4) for k in (b"key001", b"key002", b"nope")})
    assert sorted(r.key for r in some.collect()) == ["key001", "key002"]

    ranged = df.filter("key > 'key010' AND key <= 'key020' AND key LIKE 'key01%'")
    assert "Filter (" not in physical_plan(ranged, capsys)
    assert sorted(r.key for r in ranged.collect()) == [f"key{i:03d}" for i in range(11, 20)]

    pruned = df.filter("partition = 2")
    assert pruned.rdd.getNumPartitions() == 1
    assert {r.key for r in pruned.collect()} == {f"key{i:03d}" for i in range(100)
                                                 if partition_for_key(f"key{i:03d}".encode(), 4) == 2}


def test_bad_options_fail_with_one_clear_message(spark, cluster):
    def error_of(**options) -> str:
        with pytest.raises(Exception) as failure:
            reader(spark, cluster, **options).collect()
        return str(failure.value)

    assert "option key_format is 'json'; use one of binary, string" in error_of(key_format="json")
    assert "option consistency is 'eventual'; use one of linearizable, leader, follower, learner" in error_of(
        consistency="eventual")
    assert "option learner is needed with consistency=learner" in error_of(consistency="learner")
    with pytest.raises(Exception) as failure:
        spark.read.format("raftkv").option("endpoints", "127.0.0.1:1").load().collect()
    assert "no node answered at 127.0.0.1:1; check the endpoints and that the nodes are running" in str(failure.value)
    stream = spark.readStream.format("raftkv").option("endpoints", endpoints(cluster)).load()
    with pytest.raises(Exception) as failure:
        query = stream.writeStream.format("noop").start()
        try:
            query.processAllAvailable()
        finally:
            query.stop()
    assert "option changelog is missing" in str(failure.value)


def test_overwrite_replaces_the_key_range_and_append_upserts(spark, cluster):
    with Client(cluster.endpoints) as client:
        for i in range(50):
            client.put(f"old{i}", "x")
            client.put(f"keep/{i}", "x")
    df = spark.createDataFrame([(f"old{i}", f"new{i}") for i in range(0, 50, 2)], "key string, value string")
    (df.write.format("raftkv").option("endpoints", endpoints(cluster)).option("prefix", "old")
       .mode("overwrite").save())
    with Client(cluster.endpoints) as client:
        assert {k.decode(): v.decode() for k, v in client.scan(prefix="old")} == {f"old{i}": f"new{i}"
                                                                               for i in range(0, 50, 2)}
        assert len(list(client.scan(prefix="keep/"))) == 50  # outside the overwritten range

    nulls = spark.createDataFrame([("old0", None), ("old2", "again")], "key string, value string")
    nulls.write.format("raftkv").option("endpoints", endpoints(cluster)).mode("append").save()
    with Client(cluster.endpoints) as client:
        assert client.get("old0") is None  # a null value deletes the key
        assert client.get("old2") == b"again"


def test_a_read_while_a_leader_is_killed_is_a_consistent_snapshot_or_a_failed_task(spark, make_cluster):
    cluster = make_cluster(nodes=3, partitions=2)
    _read_while(spark, cluster, lambda leader: cluster.kill(leader))


def test_a_read_while_the_leaders_replica_moves_is_a_consistent_snapshot_or_a_failed_task(spark, make_cluster):
    """Each node on a host of its own, Spark on another: the move copies the replica between hosts."""
    cluster = make_cluster(nodes=4, partitions=2, rebalance_interval=0, hosts=True)

    def move(leader: str) -> None:
        with Client(cluster.endpoints) as client:
            client.move_replica(0, leader, next(n for n in ("n1", "n2", "n3", "n4")
                                                 if n not in client.topology().meta.placement[0]))
            wait_until(lambda: not client.topology().meta.moves, 60, "the move to finish")

    _read_while(spark, cluster, move)


def _read_while(spark, cluster, disrupt) -> None:
    """A Spark read while `disrupt(leader of partition 0)` happens: every row from one snapshot per
    partition, or a failed job naming the partition; never a partial result."""
    expected = {}
    with Client(cluster.endpoints) as client:
        for start in range(0, 60_000, 1000):
            for p in range(2):
                batch = [(b"k%06d" % i, b"v%06d" % i) for i in range(start, start + 1000)
                         if partition_for_key(b"k%06d" % i, 2) == p]
                client.batch(Put(k, v) for k, v in batch)
                expected.update(batch)
        leader = next(p.leader for s in client.status() for p in s.partitions if p.partition == 0 and p.leader)

    outcome = {}

    def read() -> None:
        try:
            outcome["rows"] = reader(spark, cluster, consistency="leader").collect()
        except Exception as exc:  # the job failed: that is one of the two allowed outcomes
            outcome["error"] = str(exc)

    job = threading.Thread(target=read)
    job.start()
    wait_until(lambda: spark.sparkContext.statusTracker().getActiveStageIds(), 60, "the read to start")
    disrupt(leader)
    job.join(120)
    assert not job.is_alive()
    if "rows" in outcome:
        rows = outcome["rows"]
        assert {r.key: r.value for r in rows} == expected
        assert all(len({r["index"] for r in rows if r.partition == p}) == 1 for p in range(2))
    else:
        assert "scan of partition" in outcome["error"], outcome["error"][:2000]
    # once a new leader is elected, the same read returns everything
    assert {r.key: r.value for r in reader(spark, cluster, consistency="leader").collect()} == expected


def test_stream_of_the_change_feed_restarts_from_its_checkpoint_exactly_once(spark, cluster, changelog_learner,
                                                                              tmp_path):
    learner = changelog_learner(cluster)
    with Client(cluster.endpoints) as client:
        for i in range(1000):
            client.put(f"k{i:04d}", f"v{i}")
    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "checkpoint")

    def start_stream():
        stream = (spark.readStream.format("raftkv").option("changelog", learner).option("endpoints", endpoints(cluster))
                  .option("key_format", "string").option("value_format", "string")
                  .option("maxRowsPerTrigger", 150).load())
        return (stream.writeStream.format("parquet").option("path", out).option("checkpointLocation", checkpoint)
                .trigger(processingTime="300 milliseconds").start())

    def delivered() -> int:
        try:
            return spark.read.parquet(out).count()
        except Exception:  # no committed batch yet
            return 0

    wait_until(lambda: changelog_caught_up(cluster, learner), 60, "the learner to log the first writes")
    first = start_stream()
    try:
        wait_until(lambda: delivered() >= 300, 120, "the first micro-batches")
    finally:
        first.stop()
    assert delivered() < 1000, "stopped too late to test a restart mid-feed"

    with Client(cluster.endpoints) as client:
        for i in range(300):
            client.put(f"k{i:04d}", f"w{i}")
        for i in range(100):
            client.delete(f"k{i:04d}")
        final = {k.decode(): v.decode() for k, v in client.scan()}
    wait_until(lambda: changelog_caught_up(cluster, learner), 60, "the learner to log every write")
    second = start_stream()
    try:
        second.processAllAvailable()
    finally:
        second.stop()

    rows = spark.read.parquet(out).orderBy("partition", "index", "seq").collect()
    ids = [(r.partition, r["index"], r.seq) for r in rows]
    assert len(ids) == len(set(ids)) == 1400  # 1000 creates, 300 updates, 100 deletes: each exactly once
    assert sum(r.op == "c" for r in rows) == 1000 and sum(r.op == "u" for r in rows) == 300
    replayed: dict[str, str] = {}
    for r in rows:
        if r.op == "d":
            replayed.pop(r.key)
        else:
            replayed[r.key] = r.value
    assert replayed == final


def test_reads_from_a_learner_and_the_retained_feed_as_a_batch(spark, cluster, changelog_learner):
    learner = changelog_learner(cluster)
    with Client(cluster.endpoints) as client:
        for i in range(500):
            client.put(f"k{i:03d}", f"v{i}")
    wait_until(lambda: changelog_caught_up(cluster, learner), 60, "the learner to have every write")
    copy = reader(spark, cluster, consistency="learner", learner=learner, key_format="string", value_format="string")
    assert {r.key: r.value for r in copy.collect()} == {f"k{i:03d}": f"v{i}" for i in range(500)}
    feed = reader(spark, cluster, changelog=learner, key_format="string").collect()
    assert sorted(r.key for r in feed if r.op == "c") == [f"k{i:03d}" for i in range(500)]


def test_the_example_job_transforms_and_streams_over_tls(spark, make_cluster, changelog_learner, tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    import spark_example

    cluster = make_cluster(nodes=3, partitions=4, tls=True)
    learner = changelog_learner(cluster)
    with Client(cluster.endpoints, tls=cluster.tls) as client:
        for i in range(20):
            client.put(f"users/{i}", f"name{i}")
        client.put("other", "x")
    source = {"config": str(cluster.spec_path)}  # its nodes and its [tls] client certificate
    assert spark_example.upper_case_users(spark, source) == 20
    with Client(cluster.endpoints, tls=cluster.tls) as client:
        assert dict(client.scan(prefix="users_upper/")) == {f"users_upper/{i}".encode(): f"NAME{i}".encode()
                                                            for i in range(20)}
    wait_until(lambda: changelog_caught_up(cluster, learner), 60, "the learner to log every write")
    spark_example.stream_changes_to_parquet(spark, source, learner, str(tmp_path))
    assert spark.read.parquet(str(tmp_path / "data")).count() == 41


def test_a_token_is_who_spark_reads_and_writes_as_and_it_is_never_shown(spark, make_cluster):
    """The token option authenticates (a reader's token cannot write), and neither the plans the SQL tab
    shows (a Python data source's options are not in them) nor an error quotes it."""
    cluster = make_cluster(nodes=3, partitions=2, tls=True)
    token = secrets.token_urlsafe(16)
    with Client(cluster.endpoints, tls=cluster.tls) as admin:
        admin.change_topology(GrantPermission("reader", Permission("read", "")), everywhere=True)
        admin.change_topology(PutUser(UserRecord("rita", ("reader",), hashlib.sha256(token.encode()).hexdigest())),
                              everywhere=True)
        admin.put("k", "v")
    options = {"config": str(cluster.spec_path), "token": token}
    frame = spark.read.format("raftkv").options(**options).load()
    assert [(row.key, row.value) for row in frame.collect()] == [(b"k", b"v")]
    plans = frame._jdf.queryExecution().toString()
    assert "BatchScan raftkv" in plans and token not in plans
    with pytest.raises(Exception) as denied:
        spark.createDataFrame([(b"k2", b"v2")], "key binary, value binary").write.format("raftkv") \
            .options(**options).mode("append").save()
    assert "user rita may not write key b'k2'" in str(denied.value) and token not in str(denied.value)
