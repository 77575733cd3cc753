"""The check of the processes' logs that every test that runs them gets at teardown."""

from __future__ import annotations

from tests.node_logs import records, report, unexpected

LOG = """\
2026-05-09 07:35:25,123 INFO raftkv.node.process: node n1 serving 127.0.0.1:5000
2026-05-09 07:35:26,001 ERROR asyncio: Task exception was never retrieved
future: <Task finished name='Task-7' coro=<Node._ask() done> exception=KeyError('n4')>
Traceback (most recent call last):
  File "process.py", line 1, in _ask
KeyError: 'n4'
2026-05-09 07:35:27,500 WARNING raftkv.node.mover: partition 3: move paused: n4 is gone
2026-05-09 07:35:28,000 ERROR raftkv.node.process: stopping: snapshot p0003/raft.snapshot is corrupt
Traceback (most recent call last):
  File "syncobj_snapshots.py", line 2, in read
raftkv.core.errors.CorruptData: snapshot p0003/raft.snapshot is corrupt
"""


def test_a_log_is_cut_into_records_each_with_the_lines_that_follow_it():
    assert [r.splitlines()[0][24:] for r in records(LOG)] == [
        "INFO raftkv.node.process: node n1 serving 127.0.0.1:5000",
        "ERROR asyncio: Task exception was never retrieved",
        "WARNING raftkv.node.mover: partition 3: move paused: n4 is gone",
        "ERROR raftkv.node.process: stopping: snapshot p0003/raft.snapshot is corrupt",
    ]
    assert records("Traceback (most recent call last):\n  x\n") == ["Traceback (most recent call last):\n  x"]


def test_a_traceback_or_an_unretrieved_task_exception_is_unexpected_unless_a_pattern_matches_its_record():
    assert [r.splitlines()[1] for r in unexpected(LOG)] == [
        "future: <Task finished name='Task-7' coro=<Node._ask() done> exception=KeyError('n4')>",
        "Traceback (most recent call last):",
    ]
    assert len(unexpected(LOG, ["CorruptData"])) == 1
    assert unexpected(LOG, ["CorruptData", r"KeyError\('n4'\)"]) == []


def test_the_report_names_each_log_file_and_shows_its_unexpected_records(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("logs")  # not the test's tmp_path, which the teardown check reads
    (tmp_path / "c0" / "n1").mkdir(parents=True)
    (tmp_path / "c0" / "n1" / "node.log").write_text(LOG)
    (tmp_path / "learner-feed.log").write_text(LOG)
    (tmp_path / "moto.log").write_text(LOG)  # not a raftkv process
    found = report(tmp_path, ["KeyError"])
    assert found.count("CorruptData: snapshot") == 2 and "KeyError" not in found and "moto" not in found
    assert "c0/n1/node.log:\n    2026-05-09 07:35:28,000 ERROR" in found
    assert report(tmp_path, ["KeyError", "CorruptData"]) == ""


GRPC_CANCELLED = """2026-11-26 18:12:18,102 ERROR grpc._cython.cygrpc: Exception not handled by _handle_exceptions in servicer method [/raftkv.v1.KV/Execute]
Traceback (most recent call last):
  File "src/python/grpcio/grpc/_cython/_cygrpc/aio/server.pyx.pxi", line 812, in grpc._cython.cygrpc._schedule_rpc_coro
asyncio.exceptions.CancelledError
"""


def test_grpc_cancelling_a_call_itself_is_by_design_but_not_with_a_frame_of_ours():
    assert unexpected(GRPC_CANCELLED) == []
    ours = GRPC_CANCELLED.replace('  File "src/python', '  File "/x/raftkv/node/service.py", line 9, in Execute\n  File "src/python')
    assert len(unexpected(ours)) == 1
