"""`raftkv dev up` as README's new user met it (issue 25): a node leaves or crashes under it, its terminal
closes, it is killed, a second one is started beside it. Real processes on loopback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from raftkv.core.spec import ports_per_node
from raftkv.dev.local_cluster import free_port_block, port_free
from raftkv.dev.supervision import RESTART_LIMIT, RESTART_WINDOW, Verdict, after_exit
from raftkv.meta.records import NodeState
from tests.conftest import wait_until
from tests.test_cli import RAFTKV, _running, assert_one_line_error, run


def test_a_removed_node_leaves_and_any_other_exit_is_restarted_until_it_keeps_exiting():
    now = 1000.0
    assert after_exit(NodeState.REMOVED, [], now) is Verdict.LEFT
    assert after_exit(NodeState.UP, [], now) is Verdict.RESTART
    assert after_exit(NodeState.DRAINING, [], now) is Verdict.RESTART
    assert after_exit(None, [], now) is Verdict.RESTART  # no node could say: a crash until one can
    recent = [now - 1.0 * i for i in range(RESTART_LIMIT)]
    assert after_exit(NodeState.UP, recent, now) is Verdict.GIVE_UP
    assert after_exit(NodeState.UP, [now - RESTART_WINDOW - 1] * RESTART_LIMIT, now) is Verdict.RESTART
    assert after_exit(NodeState.REMOVED, recent, now) is Verdict.LEFT


class DevUp:
    """One `raftkv dev up` process, its output collected as it comes."""

    def __init__(self, cwd: Path, args: list[str], raftkv: list[str] = RAFTKV, env: dict[str, str] | None = None):
        self.proc = subprocess.Popen([*raftkv, "dev", "up", *args], cwd=cwd, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL,
                                     env={**os.environ, **(env or {}), "COLUMNS": "300"})
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_for(self, text: str, timeout: float = 90) -> None:
        def seen():
            assert self.proc.poll() is None or text in self.output, f"dev up exited:\n{self.output}"
            return text in self.output
        wait_until(seen, timeout, f"dev up to print {text!r}", interval=0.1)

    def descendants(self) -> list[int]:
        return _descendants(self.proc.pid)

    def node_pid(self, node_id: str) -> int:
        return next(pid for pid in _children(self.proc.pid)
                    if f"\0--node\0{node_id}\0" in Path(f"/proc/{pid}/cmdline").read_text())

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)
        self._reader.join(10)


def test_the_demo_outlives_a_decommission_and_a_crash_and_nothing_outlives_the_demo(tmp_path):
    base = free_port_block(4 * ports_per_node(2) + 1)  # and the broker's, after the nodes'
    args = ["--nodes", "4", "--partitions", "2", "--base-port", str(base), "--data-dir", "devdata"]
    config = ("--config", str(tmp_path / "devdata" / "cluster.toml"))
    demo = DevUp(tmp_path, args)
    started: list[int] = []
    try:
        demo.wait_for("ready")
        assert_one_line_error(run("dev", "up", *args, cwd=tmp_path), f"port {base} (n1's API) is in use",
                              "another `raftkv dev up`")
        assert run("put", "hello", "world", *config).returncode == 0

        decommissioned = run("node", "decommission", "n2", *config, timeout=240)
        assert decommissioned.returncode == 0, decommissioned.stderr
        demo.wait_for("n2 was decommissioned: it is out of the demo")
        os.kill(demo.node_pid("n3"), signal.SIGTERM)
        demo.wait_for("n3 exited (0) and is still a member of the cluster: restarting it")
        wait_until(lambda: run("get", "hello", *config).stdout.strip() == "world", 60, "reads after n3's restart")
        assert demo.proc.poll() is None, demo.output

        started = demo.descendants()  # nodes, learner, broker
        demo.proc.send_signal(signal.SIGHUP)  # the terminal closed
        assert demo.proc.wait(60) == 0, demo.output
        wait_until(lambda: not any(_running(pid) for pid in started), 30, "everything dev up started to stop")
    finally:
        demo.close()
        _kill_all(started)

    again = DevUp(tmp_path, args)  # on the same data, n2 gone from it
    try:
        again.wait_for("ready")
        again.wait_for("n2 was decommissioned")  # it starts, learns it was removed, and exits
        assert run("get", "hello", *config).stdout.strip() == "world"
        started = again.descendants()
        assert len(started) >= 5, again.output  # three nodes, the learner and the broker
        again.proc.kill()  # no chance to clean up: its children must follow it by themselves
        again.proc.wait(10)
        wait_until(lambda: not any(_running(pid) for pid in started), 30, "dev up's children to die with it")
    finally:
        again.close()
        _kill_all(started)
    wait_until(lambda: all(port_free(base + i) for i in range(4 * ports_per_node(2) + 1)), 30,
               "every node and broker port to be released")


def _children(pid: int) -> list[int]:
    try:
        return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except FileNotFoundError:
        return []


def _descendants(pid: int) -> list[int]:
    found = _children(pid)
    for child in list(found):
        found += _descendants(child)
    return found


def _kill_all(pids: list[int]) -> None:
    for pid in pids:
        if _running(pid):
            os.kill(pid, signal.SIGKILL)


def test_children_forked_while_a_grpc_client_is_busy_start_cleanly():
    """dev up starts its nodes and learner with a preexec_fn (they die with it), so they are forked:
    with gRPC's fork handlers on, about one in fifteen died before its exec (SIGABRT, SIGSEGV) while a
    client of the parent was busy (found by the upgrade script's runs)."""
    env = {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}
    probe = subprocess.run([sys.executable, str(Path(__file__).parent / "fork_probe.py"), "40"], capture_output=True,
                           text=True, timeout=120, env=env, cwd=Path(__file__).parent.parent)
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.split() == ["0"] * 40, probe.stdout + probe.stderr
