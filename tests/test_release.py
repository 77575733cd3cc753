"""The wheel a release ships: built from the tracked files alone, installed apart from the source tree,
it runs `raftkv dev up` and serves (issue 29 item 2). Its dependencies come from this environment: the
test checks what the wheel holds (code, package data, entry points), not PyPI. And what the rolling
upgrade's script (scripts/upgrade_check.py, issue 29 item 3) checks before it starts anything; the upgrade
itself takes 40-60 s, so it runs outside make test (docs/operations.md, "Upgrading")."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from raftkv import Client
from raftkv.chaos.engine_use import engine_counts
from raftkv.core.release import VERSION
from raftkv.core.spec import ports_per_node
from raftkv.dev.local_cluster import free_port_block
from raftkv.meta.cluster_version import RaiseClusterVersion
from tests.conftest import wait_until
from tests.test_cli import _running, assert_one_line_error
from tests.test_dev_up import DevUp, _kill_all

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import upgrade_check  # noqa: E402
from upgrade_release import installed_version, unmet_requirements  # noqa: E402


def _wheel(tmp_path: Path) -> Path:
    """`pip wheel` (PEP 517, as `python -m build` does) of a copy of what git tracks: nothing untracked
    in the working tree can make the wheel work."""
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    source = tmp_path / "source"
    for name in filter(None, tracked.decode().split("\0")):
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(tmp_path / "dist"), str(source)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout + built.stderr
    [wheel] = (tmp_path / "dist").glob("raftkv-*.whl")
    return wheel


def test_the_wheel_installs_apart_from_the_source_and_runs_the_demo(tmp_path):
    wheel = _wheel(tmp_path)
    assert wheel.name.startswith(f"raftkv-{VERSION}-")
    site = tmp_path / "site"
    installed = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site),
                                str(wheel)], capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    env = {"PYTHONPATH": str(site)}
    where = subprocess.run([sys.executable, "-c", "import raftkv, learners; print(raftkv.__file__, learners.__file__)"],
                           capture_output=True, text=True, env={**os.environ, **env}, cwd=tmp_path, timeout=60)
    assert all(Path(f).is_relative_to(site) for f in where.stdout.split()), where.stdout + where.stderr

    base = free_port_block(ports_per_node(2) * 3 + 1)  # three nodes, then the broker's port
    demo = DevUp(tmp_path, ["--partitions", "2", "--base-port", str(base), "--data-dir", "devdata"],
                 raftkv=[str(site / "bin" / "raftkv")], env=env)
    started: list[int] = []
    try:
        demo.wait_for("ready")
        started = demo.descendants()
        config = ("--config", str(tmp_path / "devdata" / "cluster.toml"))
        cli = [str(site / "bin" / "raftkv")]

        def run(*args: str) -> subprocess.CompletedProcess:
            return subprocess.run([*cli, *args, *config], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                                  env={**os.environ, **env}, stdin=subprocess.DEVNULL)

        assert run("put", "hello", "wheel").returncode == 0
        assert run("get", "hello").stdout.strip() == "wheel"
        assert f"releases: n1 {VERSION}" in run("status").stdout
        demo.proc.send_signal(signal.SIGINT)
        assert demo.proc.wait(60) == 0, demo.output
        wait_until(lambda: not any(_running(pid) for pid in started), 30, "everything dev up started to stop")
    finally:
        demo.close()
        _kill_all(started)


def test_the_cluster_version_rises_to_the_release_every_member_runs_and_an_older_node_is_refused(make_cluster):
    """No older release is at hand here (the upgrade from c191d37 is docs/operations.md's script): the
    cluster version is raised past this build the way the metadata leader raises it, with every
    member's word for it, and the build's node is then refused at start, in one line. On the way, the
    nodes (`raft_engine = "auto"`) hand settled partitions to the node engine once the version has it."""
    cluster = make_cluster(nodes=3, partitions=1, raft_engine="auto")
    with Client(cluster.endpoints, timeout=10.0) as kv:
        wait_until(lambda: kv.topology().meta.cluster_version == VERSION, 30, f"the cluster version to reach {VERSION}")

        def engine_took() -> bool:
            kv.put(b"engine", b"on")
            return any(taken for taken, _ in engine_counts(cluster.spec).values())
        wait_until(engine_took, 10, "a leader to offer its partition to the node engine")
        leader = wait_until(lambda: kv.topology().meta_leader, 10, "a metadata leader")
        stopped = next(n for n in ("n3", "n2", "n1") if n != leader)  # the metadata group keeps its leader
        cluster.stop(stopped)
        kv.change_topology(RaiseClusterVersion("99.0", tuple((n, "99.0") for n in ("n1", "n2", "n3"))),
                           everywhere=True)
    proc = cluster.start(stopped)
    assert proc.wait(timeout=60) == 2
    lines = cluster.log_path(stopped).read_text().splitlines()
    assert f"this node runs raftkv {VERSION}, older than the cluster version 99.0" in lines[-1], lines[-5:]
    assert not any("Traceback" in line for line in lines)


def test_the_older_release_needs_nothing_this_environment_lacks_and_a_lack_is_named():
    """c191d37's setup.cfg as released (testdata, so that a shallow clone runs this too)."""
    setup_cfg = (Path(__file__).parent / "testdata" / "upgrade" / "setup-0.1.0.cfg").read_text()
    assert unmet_requirements(setup_cfg, installed_version) == []
    have = {"pysyncobj": "0.3.17", "grpcio": "1.80.0"}.get
    assert unmet_requirements("[options]\ninstall_requires =\n    # pinned\n    pysyncobj==0.3.17\n    grpcio>=1.85.1,<2\n"
                              "    rocksdict>=0.3\n", have) == ["grpcio<2,>=1.85.1 (this environment has 1.80.0)",
                                                              "rocksdict>=0.3 (this environment has none)"]


def test_upgrade_check_refuses_bad_input_in_one_line(capsys):
    for args, said in ((["--nodes", "2"], "--nodes must be 3 or more"), (["--warmup", "-1"], "must be above 0"),
                       (["--release", "no-such-commit"], "is not a commit")):
        code = upgrade_check.main(args)
        out, err = capsys.readouterr()
        assert_one_line_error(subprocess.CompletedProcess(args, code, out, err), said)

