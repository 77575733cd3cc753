"""The `raftkv` command as a user runs it: real subprocesses, exit codes, one-line errors."""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from raftkv import Client, InvalidRequest
from raftkv.api import kv_pb2 as pb
from raftkv.api import kv_pb2_grpc
from raftkv.core.partitioning import partition_for_key
from raftkv.core.release import VERSION
from raftkv.core.spec import ports_per_node
from raftkv.core.spec_toml import load_spec
from raftkv.dev.local_cluster import free_port_block, port_free
from tests.conftest import wait_until

RAFTKV = [sys.executable, "-m", "raftkv"]


def run(*args: str, cwd: Path | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([*RAFTKV, *args], capture_output=True, text=True, cwd=cwd, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def assert_one_line_error(result: subprocess.CompletedProcess, *fragments: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_cluster_init_writes_a_spec_and_refuses_to_overwrite(tmp_path):
    result = run("cluster", "init", "--nodes", "3", "--partitions", "5", "--base-port", "21000",
                 "--data-dir", "data", "-o", "cluster.toml", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    text = (tmp_path / "cluster.toml").read_text()
    assert "partitions = 5" in text and 'id = "n3"' in text and "api_port = 21016" in text
    assert 'durability = "fsync"' in text  # durable by default (docs/durability.md)
    spec = load_spec(tmp_path / "cluster.toml")  # TLS by default: a CA and certificates beside the spec
    assert spec.tls.ca == tmp_path / "certs" / "ca.pem" and spec.tls.node("n3")[0].exists()
    assert spec.tls.client_cert.name == "user-admin.pem" and spec.tls.learner_cert.exists()
    assert_one_line_error(run("cluster", "init", "-o", "cluster.toml", cwd=tmp_path), "exists", "--force")
    assert run("cluster", "init", "--no-tls", "--force", "-o", "cluster.toml", cwd=tmp_path).returncode == 0
    assert load_spec(tmp_path / "cluster.toml").tls is None
    deep = tmp_path / ("a-long-folder-name-" * 4)  # past 80 columns, where rich wrapped lines into pipes
    deep.mkdir()
    said = run("cluster", "init", "--no-tls", "-o", str(deep / "cluster.toml"), cwd=tmp_path).stdout
    assert f"start each node with: raftkv node start --config {deep / 'cluster.toml'} --node <id>" in said.splitlines()[-1]


def test_bad_specs_get_one_clear_line(tmp_path):
    (tmp_path / "broken.toml").write_text("[cluster\nname=")
    assert_one_line_error(run("status", "--config", str(tmp_path / "broken.toml")), "not valid TOML")
    (tmp_path / "wrong.toml").write_text('[cluster]\nname="x"\npartitions="eight"\nreplication=3\n[[nodes]]\nid="n1"\n')
    assert_one_line_error(run("node", "start", "--config", str(tmp_path / "wrong.toml"), "--node", "n1"),
                          "cluster.partitions: expected int", "nodes[0].host: missing")
    assert_one_line_error(run("status", "--config", str(tmp_path / "missing.toml")), "raftkv cluster init")


def test_node_errors_name_the_problem(make_cluster):
    cluster = make_cluster(nodes=3, partitions=2, start=False)
    config = str(cluster.spec_path)
    assert_one_line_error(run("node", "start", "--config", config, "--node", "n9"), "'n9' is not in the spec", "n1, n2, n3")
    n1 = cluster.spec.node("n1")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", n1.raft_port_base + 1))
        busy.listen()
        assert_one_line_error(run("node", "start", "--config", config, "--node", "n1"),
                              f"127.0.0.1:{n1.raft_port_base + 1}", "raft port of partition 1")


def test_a_node_prints_every_threads_stack_on_sigusr1_and_runs_on(make_cluster):
    """How an operator sees where a stuck node is (the chaos run's silent start on a failing disk)."""
    cluster = make_cluster(nodes=1, partitions=1, replication=1)
    cluster.procs["n1"].send_signal(signal.SIGUSR1)
    log = cluster.log_path("n1")
    # the main thread, in the node's event loop (the dump of the other threads may come first)
    wait_until(lambda: "raftkv/cli/node.py" in log.read_text(errors="replace"), 10, "the main thread's stack in the log")
    assert "most recent call first" in log.read_text()
    with Client([cluster.spec.node("n1").api_address], timeout=10) as kv:
        kv.put(b"still", b"serving")
        assert kv.get(b"still") == b"serving"


def _values_round_trip_byte_for_byte(config: list[str], tmp: Path) -> None:
    """Issue 25: a 100,000-byte value came back as 101,250 (wrapped at 80 columns), tabs as spaces;
    `put K -` stored a literal '-'; values that were not UTF-8 were refused."""
    raw = subprocess.run
    big = bytes(range(256)) * 390 + b"a\tb\n" * 10  # not UTF-8, tabs, line breaks: 99,880 bytes
    (tmp / "value.bin").write_bytes(big)
    assert run("put", "from-file", "--value-file", str(tmp / "value.bin"), *config).returncode == 0
    assert raw([*RAFTKV, "put", "from-stdin", "-", *config], input=b"a\tb", capture_output=True).returncode == 0
    assert raw([*RAFTKV, "put", "from-argv", b"\xff\tz", *config], capture_output=True).returncode == 0
    for key, value in (("from-file", big), ("from-stdin", b"a\tb"), ("from-argv", b"\xff\tz")):
        got = raw([*RAFTKV, "get", key, *config], capture_output=True)
        assert got.returncode == 0 and got.stdout == value, (key, len(got.stdout))
    scan = raw([*RAFTKV, "scan", "--prefix", "from-", *config], capture_output=True)
    assert scan.stdout == b"from-argv\t\xff\tz\nfrom-file\t" + big + b"\nfrom-stdin\ta\tb\n"
    as_json = [json.loads(line) for line in run("scan", "--prefix", "from-", "--json", "--text", *config).stdout.splitlines()]
    assert [(item["encoding"], item["value"]) for item in as_json] == [
        ("base64", base64.b64encode(b"\xff\tz").decode()), ("base64", base64.b64encode(big).decode()),
        ("utf-8", "a\tb")]
    assert json.loads(run("get", "from-stdin", "--json", *config).stdout)["value"] == base64.b64encode(b"a\tb").decode()
    assert_one_line_error(run("put", "k", *config), "give the value as VALUE, as - to read it from stdin")
    assert_one_line_error(run("put", "k", "--value-file", str(tmp / "missing"), *config), "cannot read")


def test_unreachable_cluster_is_one_line():
    assert_one_line_error(run("get", "x", "--endpoints", "127.0.0.1:1", "--timeout", "1"), "no node answered")


@pytest.fixture(scope="module")
def plain_cluster(make_module_cluster):
    """Shared by the tests that write keys of their own and stop no node."""
    return make_module_cluster(nodes=3, partitions=4)


def test_cli_data_commands_status_and_limits(plain_cluster):
    cluster = plain_cluster
    config = ["--config", str(cluster.spec_path)]
    assert run("put", "greeting", "hello", *config).returncode == 0
    got = run("get", "greeting", *config)
    assert got.returncode == 0 and got.stdout.strip() == "hello"
    missing = run("get", "nope", *config)
    assert missing.returncode == 1 and "not found" in missing.stderr
    assert_one_line_error(run("put", "k" * 5000, "v", *config), "5000 bytes", "cluster.max_key_bytes")
    scan = run("scan", "--prefix", "greet", "--json", "--text", *config)
    assert [json.loads(line) for line in scan.stdout.splitlines()] == [
        {"key": "greeting", "value": "hello", "encoding": "utf-8"}]
    _values_round_trip_byte_for_byte(config, cluster.spec.node("n1").data_dir.parent)
    assert run("delete", "greeting", *config).returncode == 0
    assert run("get", "greeting", *config).returncode == 1
    status = json.loads(run("status", "--json", *config).stdout)
    assert len(status["partitions"]) == 4 * 3
    assert sorted(r["partition"] for r in status["partitions"] if r["role"] == "leader") == [0, 1, 2, 3]
    assert all(r["members"] == ["n1", "n2", "n3"] for r in status["partitions"])
    assert [(n["node"], n["version"]) for n in status["nodes"]] == [(n, VERSION) for n in ("n1", "n2", "n3")]
    table = run("status", *config).stdout
    assert "leader" in table and "n1" in table
    assert f"releases: n1 {VERSION}, n2 {VERSION}, n3 {VERSION}; cluster version" in table
    assert run("--version").stdout.strip() == f"raftkv, version {VERSION}"


def test_api_rejects_bad_input_and_writes_nothing(plain_cluster):
    cluster = plain_cluster
    with Client(cluster.endpoints) as kv:
        with pytest.raises(InvalidRequest, match="max_value_bytes"):
            kv.put(b"big", b"x" * (1024 * 1024 + 1))
        with pytest.raises(InvalidRequest, match="must not be empty"):
            kv.put(b"", b"v")
        with pytest.raises(InvalidRequest, match="bytes or str"):
            kv.put(b"k", 42)
        assert kv.get(b"big") is None
        partitions = cluster.spec.partitions
        keys = [k for k in (b"many-%d" % i for i in range(200)) if partition_for_key(k, partitions) == 0][:5]
        with pytest.raises(InvalidRequest, match="one write may carry at most 4,194,304"):
            kv.put_many(keys, [b"x" * (1024 * 1024)] * 5)  # each value within its limit, the five past one entry
        assert [kv.get(k) for k in keys] == [None] * 5
    address = cluster.spec.nodes[0].api_address
    with grpc.insecure_channel(address) as channel:
        stub = kv_pb2_grpc.KVStub(channel)
        results = stub.Execute(pb.ExecuteRequest(ops=_BAD_OPS)).results
        assert [r.code for r in results] == [pb.INVALID] * len(_BAD_OPS)
        assert "does not exist" in results[1].message
        garbage = channel.unary_unary("/raftkv.v1.KV/Execute", request_serializer=lambda b: b,
                                      response_deserializer=lambda b: b)
        with pytest.raises(grpc.RpcError) as failure:
            garbage(b"\xff\xff\xff\xff not a protobuf", timeout=5)
        assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # was UNKNOWN, and a logged traceback
        assert "malformed request: Error parsing message with type 'raftkv.v1.ExecuteRequest'" in failure.value.details()
        with pytest.raises(grpc.RpcError) as failure:
            list(stub.Scan(pb.ScanRequest(partition=99), timeout=5))  # was an IndexError in the node
        assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "partition 99 does not exist" in failure.value.details()
    with Client(cluster.endpoints) as kv:  # the node survived all of it
        kv.put(b"still", b"alive")
        assert kv.get(b"still") == b"alive"
    assert "Traceback" not in cluster.log_path("n1").read_text()


_BAD_OPS = [
    pb.Op(partition=0),                                                                # no operation set
    pb.Op(partition=99, put=pb.Put(key=b"k", value=b"v")),                             # no such partition
    pb.Op(partition=(partition_for_key(b"zz", 4) + 1) % 4, put=pb.Put(key=b"zz", value=b"v")),  # wrong one
    pb.Op(partition=0, get=pb.Get(key=b"")),                                           # empty key
]


def test_bad_ops_are_invalid_even_on_a_node_that_has_no_leader_to_forward_to(make_cluster):
    """Validation happens where an op arrives; it once waited for the leader and said UNAVAILABLE."""
    cluster = make_cluster(nodes=3, partitions=4)
    cluster.kill("n2")
    cluster.kill("n3")
    with grpc.insecure_channel(cluster.spec.nodes[0].api_address) as channel:
        results = kv_pb2_grpc.KVStub(channel).Execute(pb.ExecuteRequest(ops=_BAD_OPS), timeout=30).results
    assert [r.code for r in results] == [pb.INVALID] * len(_BAD_OPS), [r.message for r in results]


def test_dev_up_starts_serves_and_stops_everything_even_with_its_stdout_gone(tmp_path):
    base = free_port_block(3 * ports_per_node(2))
    proc = subprocess.Popen(
        [*RAFTKV, "dev", "up", "--partitions", "2", "--base-port", str(base), "--data-dir", "devdata"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL,
        env={**os.environ, "COLUMNS": "200"},
    )
    try:
        output = []
        def ready():
            line = proc.stdout.readline()
            output.append(line)
            return "ready" in line or proc.poll() is not None
        wait_until(ready, 90, "dev up to print ready")
        assert proc.poll() is None, "".join(output)
        assert run("put", "dev", "works", "--config", str(tmp_path / "devdata" / "cluster.toml")).returncode == 0
        got = run("get", "dev", "--config", str(tmp_path / "devdata" / "cluster.toml"))
        assert got.stdout.strip() == "works"
        tail_command = next(line for line in output if "raftkv feed tail" in line).split("watch the feed:")[1].split()
        tail = run(*tail_command[1:], "--max-events", "1", "--timeout", "30", cwd=tmp_path, timeout=90)
        event = json.loads(tail.stdout.splitlines()[0])
        assert event["op"] == "c" and base64.b64decode(event["key"]) == b"dev", tail.stdout + tail.stderr
    finally:
        started = _children(proc.pid)  # nodes, learner, broker (in a session of its own: no Ctrl-C reaches it)
        proc.stdout.close()  # as a `| tee` does when Ctrl-C stops it first: "stopping..." cannot be printed
        proc.send_signal(signal.SIGINT)
        proc.wait(30)
        left = [pid for pid in started if _running(pid)]
        for pid in left:
            os.kill(pid, signal.SIGKILL)
    assert not left, f"dev up left processes running: {left}"
    assert proc.returncode == 1  # rich's exit when stdout is gone, once everything is stopped
    wait_until(lambda: all(port_free(base + i) for i in range(13)), 10, "every node and broker port to be released")


def _children(pid: int) -> list[int]:
    return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"  # a zombie has stopped
    except FileNotFoundError:
        return False


def test_a_node_whose_peers_are_unreachable_keeps_running_and_writes_fail_clearly(make_cluster):
    cluster = make_cluster(nodes=3, partitions=2, start=False)
    cluster.start("n1")  # its peers never come up
    n1 = cluster.spec.node("n1")
    wait_until(lambda: not port_free(n1.api_port), 30, "n1 to listen")
    failed = run("put", "k", "v", "--endpoints", n1.api_address, "--timeout", "2")
    assert_one_line_error(failed, "no leader")
    assert cluster.procs["n1"].poll() is None, "n1 exited"
    status = json.loads(run("status", "--json", "--endpoints", n1.api_address).stdout)
    assert {r["role"] for r in status["partitions"]} <= {"follower", "candidate"}
    assert all(r["has_quorum"] is False for r in status["partitions"])


def test_a_command_loads_only_its_own_family():
    probe = ("import sys; from raftkv.cli import cli; "
             "cli.main(['learner', '--help'], standalone_mode=False); "
             "print(sorted(m for m in sys.modules if m.startswith('raftkv.cli.') or m == 'raftkv.chaos.runner'))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.splitlines()[-1] == "['raftkv.cli.learner', 'raftkv.cli.options', 'raftkv.cli.output']"


# -- hostile arguments (found by tests/test_fuzz_cli.py) ------------------------------------------


def test_keys_that_are_not_utf8_are_a_usage_error(tmp_path):
    result = run("put", b"caf\xe9", "v", "--endpoints", "127.0.0.1:1", cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.splitlines()[-1] == "Error: Invalid value for 'KEY': 'caf\\udce9' is not UTF-8 text"


def test_specs_are_written_in_utf8_and_named_as_given(tmp_path):
    assert_one_line_error(run("cluster", "init", "--no-tls", "--name", b"caf\xe9", cwd=tmp_path),
                          "b'\\xe9' is not UTF-8 text")
    for name, shown in ((b"caf\xe9.toml", "caf\\udce9.toml"), ("[/].toml", "[/].toml")):  # not rich markup either
        result = run("cluster", "init", "--no-tls", "-o", name, cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith(f"wrote {shown}: 3 nodes")


@pytest.mark.parametrize("argv", [("cluster", "init", "-o", "x" * 300), ("certs", "init", "--out", "x" * 300)])
def test_a_file_name_the_os_refuses_is_one_line(tmp_path, argv):
    assert_one_line_error(run(*argv, cwd=tmp_path), "cannot write", "File name too long")


def test_line_breaks_in_arguments_stay_on_the_error_line(tmp_path):
    assert_one_line_error(run("get", "k", "--endpoints", "a\nb:1", "--timeout", "1", cwd=tmp_path),
                          "no node answered at a\\nb:1")
    result = run("learner", "remove", "--name", "l", "a\nb", cwd=tmp_path)
    assert result.returncode == 2 and result.stderr.splitlines()[-1] == "Error: Got unexpected extra argument (a\\nb)"
