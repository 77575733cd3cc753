"""The console in headless Chromium, the alert rules in a real Prometheus, and the dashboards' metrics,
against one real 4-node cluster with a learner (shared by the module: docs/console.md): during a
replica move, then after a node is killed. A failed page check leaves a screenshot in the test's
tmp_path."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from html.parser import HTMLParser
from pathlib import Path
from typing import Iterator

import pytest

from raftkv.client.sync_client import Client
from raftkv.core.partitioning import partition_for_key
from raftkv.core.spec import Tuning, build_spec, ports_per_node
from raftkv.core.spec_toml import save_spec
from raftkv.dev.local_cluster import LocalCluster, free_port_block
from raftkv.meta.access import GrantPermission, Permission, PutUser, UserRecord
from tests import node_logs
from tests.conftest import wait_until

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = shutil.which("chromium")
PROMETHEUS = shutil.which("prometheus")
PARTITIONS = 4
MOVED_MB = 10  # the moved partition's size: the copy reads 1 MB a second (a fail point), so a 10 s move

pytestmark = pytest.mark.skipif(CHROMIUM is None or PROMETHEUS is None,
                                reason="needs Debian's chromium and prometheus (make system-deps)")


@dataclasses.dataclass
class Scene:
    cluster: LocalCluster
    folder: Path
    learner: subprocess.Popen
    learner_metrics: int
    prometheus: subprocess.Popen | None = None
    prometheus_port: int = 0
    scraped: dict[str, str] = dataclasses.field(default_factory=dict)  # process -> its /metrics text
    moved: tuple[int, str, str] | None = None  # (partition, from, to) of the move the first test began

    def url(self, node: str, path: str = "/") -> str:
        return f"http://127.0.0.1:{self.cluster.spec.node(node).metrics_port}{path}"


def _get(url: str, timeout: float = 5.0, headers: dict | None = None, context=None) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=timeout,
                                    context=context) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def _api(scene: Scene, page: str, node: str = "n1") -> dict:
    status, body = _get(scene.url(node, f"/api/{page}"))
    assert status == 200, body
    return json.loads(body)


def _raftkv(*args: str, timeout: float = 60) -> None:
    subprocess.run([sys.executable, "-m", "raftkv", *args], check=True, capture_output=True, timeout=timeout)


@pytest.fixture(scope="module")
def scene(tmp_path_factory) -> Iterator[Scene]:
    folder = tmp_path_factory.mktemp("console")
    base = free_port_block(4 * ports_per_node(PARTITIONS) + 3)
    spec = build_spec(nodes=4, partitions=PARTITIONS, replication=3, base_port=base, data_dir=folder,
                      durability="lose-last-second")
    spec = dataclasses.replace(spec, tuning=Tuning(rebalance_interval=0))  # the test moves; the planner shows
    path = save_spec(spec, folder / "cluster.toml")
    cluster = LocalCluster(spec, path, env={"RAFTKV_FAILPOINTS": "checkpoint-read-before=delay(1000)"})
    learner_api, learner_metrics, prometheus_port = (base + 4 * ports_per_node(PARTITIONS) + i for i in range(3))
    processes: list[subprocess.Popen] = []
    try:
        cluster.start_all()
        cluster.wait_ready(timeout=60)
        config = ["--config", str(path)]
        _raftkv("learner", "add", "--name", "changes", "--sink", "changelog",
                "--sink-option", f"path={folder / 'changelog'}", *config)
        with open(folder / "learner.log", "ab") as log:
            learner = subprocess.Popen([sys.executable, "-m", "raftkv", "learner", "start", "--name", "changes",
                                        "--api-port", str(learner_api), "--metrics-port", str(learner_metrics),
                                        *config], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        processes.append(learner)
        scene = Scene(cluster, folder, learner, learner_metrics)
        yield scene
    finally:
        for proc in processes + ([scene.prometheus] if "scene" in locals() and scene.prometheus else []):
            proc.kill()
            proc.wait()
        for node_id in list(cluster.procs):
            cluster.kill(node_id)
    if found := node_logs.report(folder, []):
        pytest.fail(f"tracebacks in the processes' logs:\n{found}", pytrace=False)


# -- the browser ----------------------------------------------------------------

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
                  "--window-size=1280,900"]


def _chromium(url: str, *args: str, budget_ms: int = 4000) -> str:
    with tempfile.TemporaryDirectory() as profile:
        done = subprocess.run([CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
                               f"--virtual-time-budget={budget_ms}", *args, url],
                              capture_output=True, text=True, timeout=60)
    return done.stdout


class Page(HTMLParser):
    """The rendered DOM: its elements' attributes, and its text."""

    def __init__(self, dom: str):
        super().__init__()
        self.dom = dom
        self.elements: list[dict[str, str]] = []
        self.text: list[str] = []
        self.feed(dom)

    def handle_starttag(self, tag, attrs):
        self.elements.append({"tag": tag, **{k: v or "" for k, v in attrs}})

    def handle_data(self, data):
        self.text.append(data)

    def having(self, **attrs: str) -> list[dict[str, str]]:
        wanted = {k.replace("_", "-"): v for k, v in attrs.items()}
        return [e for e in self.elements if all(e.get(k) == v for k, v in wanted.items())]

    @property
    def words(self) -> str:
        return " ".join(" ".join(self.text).split())


def render(urls: dict[str, str]) -> dict[str, Page]:
    """Each page as a person's browser draws it, several browsers at once."""
    with ThreadPoolExecutor(max_workers=3) as pool:
        doms = dict(zip(urls, pool.map(lambda url: _chromium(url, "--dump-dom"), urls.values())))
    return {name: Page(dom) for name, dom in doms.items()}


@contextmanager
def checking(page: Page, url: str, shots: Path, name: str) -> Iterator[Page]:
    """A screenshot of the page in `shots` if what the block asserts fails."""
    try:
        assert page.having(tag="body", data_ready="1"), f"{url} did not finish drawing"
        yield page
    except AssertionError:
        _chromium(url, f"--screenshot={shots / (name + '.png')}")
        raise


# -- the scenes -------------------------------------------------------------------

def _keys_of(partition: int, count: int) -> list[bytes]:
    keys, i = [], 0
    while len(keys) < count:
        key = b"big-%06d" % i
        if partition_for_key(key, PARTITIONS) == partition:
            keys.append(key)
        i += 1
    return keys


def _scrape_nodes(scene: Scene) -> None:
    for n in scene.cluster.spec.nodes:
        scene.scraped[n.id] = _get(scene.url(n.id, "/metrics"))[1].decode()


def test_every_page_during_a_replica_move_with_a_learner_behind(scene, tmp_path):
    cluster = scene.cluster
    with Client(cluster.endpoints, timeout=10) as kv:
        meta = kv.topology().meta
        p, (source, target) = next((p, (v[-1], t)) for p, v in enumerate(meta.placement)
                                   for t in cluster.spec.node_ids if t not in v)
        wait_until(lambda: all(lr.progress for s in kv.status() for ps in s.partitions if ps.role == "leader"
                               for lr in ps.learners), 30, "the learner to deliver on every partition")
        wait_until(lambda: "raftkv_learner_lag_seconds{" in (scene.scraped.setdefault("learner", "") + _get(
            f"http://127.0.0.1:{scene.learner_metrics}/metrics")[1].decode()), 10, "the learner's metrics")
        scene.scraped["learner"] = _get(f"http://127.0.0.1:{scene.learner_metrics}/metrics")[1].decode()
        scene.learner.send_signal(signal.SIGSTOP)  # its lag grows with what follows
        for key in _keys_of(p, MOVED_MB * 4):
            kv.put(key, os.urandom(256 * 1024))
        kv.move_replica(p, source, target)
    wait_until(lambda: (moves := _api(scene, "moves")["under_way"]) and (moves[0]["bytes"] or 0) > 0, 20,
               "the move's copy to begin")
    _scrape_nodes(scene)  # the move's and the learners' series exist now: for the dashboards' test
    urls = {"moves": scene.url("n1", "/moves"), "placement": scene.url("n1", "/placement")}
    pages = render(urls)  # first the two that need the move under way
    urls |= {"learners": scene.url("n1", "/learners"), "overview": scene.url("n1", "/"),
             "partition": scene.url("n2", f"/partition?p={p}"), "bad-partition": scene.url("n1", "/partition?p=99"),
             "series": scene.url("n1", "/series?window=600"), "events": scene.url("n3", "/events")}
    pages |= render({name: url for name, url in urls.items() if name not in pages})
    scene.moved = (p, source, target)
    with checking(pages["moves"], urls["moves"], tmp_path, "moves") as page:
        assert page.having(tag="tr", data_move=str(p)), page.words
        assert f"partition {p} {source} {target} catching_up" in page.words
        assert re.search(r"[\d.]+ MB", page.words) and page.having(tag="span", **{"class": "bar"})
    with checking(pages["placement"], urls["placement"], tmp_path, "placement") as page:
        assert page.having(tag="span", data_role="moving") and "copied" in page.words, page.words
    with checking(pages["learners"], urls["learners"], tmp_path, "learners") as page:
        heading = page.having(tag="h2", data_learner="changes")
        assert heading and int(heading[0]["data-max-lag"]) >= MOVED_MB * 4, page.words
        assert "sink changelog" in page.words
    with checking(pages["overview"], urls["overview"], tmp_path, "overview") as page:
        assert sorted(e["data-node"] for e in page.having(tag="tr", data_state="up")) == ["n1", "n2", "n3", "n4"]
        assert "every partition has a leader and its replicas" in page.words
    with checking(pages["partition"], urls["partition"], tmp_path, "partition") as page:
        assert f"Partition {p}" in page.words and "leads (term" in page.words
    with checking(pages["bad-partition"], urls["bad-partition"], tmp_path, "bad-partition") as page:
        assert page.having(tag="p", id="error") and "p=99 is out of range" in page.words
    with checking(pages["series"], urls["series"], tmp_path, "series") as page:
        writes = page.having(tag="div", data_field="writes")
        assert writes and int(writes[0]["data-points"]) > 0
    with checking(pages["events"], urls["events"], tmp_path, "events") as page:
        assert f"move {source} → {target} begun" in page.words and page.having(tag="tr", data_kind="leader")


def test_every_metric_a_dashboard_panel_queries_is_exported(scene):
    if not scene.scraped:
        pytest.skip("the move test scrapes the metrics")
    exported = {m.group(1) for text in scene.scraped.values()
                for m in re.finditer(r"^([a-z_]+)(?:\{| )", text, re.MULTILINE)}
    queried = {}
    for board in (ROOT / "deploy" / "grafana").glob("*.json"):
        for panel in json.loads(board.read_text())["panels"]:
            for target in panel["targets"]:
                for name in re.findall(r"\b((?:raftkv|process)_[a-z_]+)", target["expr"]):
                    queried.setdefault(name, f"{board.name}: {panel['title']}")
    assert len(queried) > 20
    missing = {name: where for name, where in queried.items() if name not in exported}
    assert not missing, f"queried but exported by no node or learner: {missing}"


def test_the_alert_rules_are_valid():
    done = subprocess.run(["promtool", "check", "rules", str(ROOT / "deploy" / "prometheus" / "alerts.yml")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "SUCCESS: 10 rules found" in done.stdout, done.stdout + done.stderr


def _alerts(scene: Scene) -> list[dict]:
    status, body = _get(f"http://127.0.0.1:{scene.prometheus_port}/api/v1/alerts")
    return json.loads(body)["data"]["alerts"] if status == 200 else []


def _start_prometheus(scene: Scene) -> None:
    """A real Prometheus scraping every node each second and evaluating deploy/prometheus/alerts.yml."""
    scene.prometheus_port = scene.learner_metrics + 1
    targets = [f"127.0.0.1:{n.metrics_port}" for n in scene.cluster.spec.nodes]
    config = scene.folder / "prometheus.yml"
    config.write_text(json.dumps({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(ROOT / "deploy" / "prometheus" / "alerts.yml")],
        "scrape_configs": [{"job_name": "raftkv", "static_configs": [{"targets": targets}]}]}))
    with open(scene.folder / "prometheus.log", "ab") as log:
        scene.prometheus = subprocess.Popen([PROMETHEUS, f"--config.file={config}",
                                             f"--storage.tsdb.path={scene.folder / 'tsdb'}",
                                             f"--web.listen-address=127.0.0.1:{scene.prometheus_port}"],
                                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def _up(scene: Scene) -> dict[str, float]:
    status, body = _get(f"http://127.0.0.1:{scene.prometheus_port}/api/v1/query?query=up")
    results = json.loads(body)["data"]["result"] if status == 200 else []
    return {r["metric"]["instance"]: float(r["value"][1]) for r in results}


def test_a_killed_node_is_shown_dead_and_prometheus_alerts_on_it(scene, tmp_path):
    cluster = scene.cluster
    _start_prometheus(scene)
    if scene.moved:  # the move the first test saw under way, ended since
        p, source, target = scene.moved
        wait_until(lambda: any(e["text"] == f"move {source} → {target} completed"  # samplers note it within 1 s
                               for e in _api(scene, "moves")["recent"]), 60, "the move to complete")
    wait_until(lambda: sorted(_up(scene).values()) == [1.0] * 4, 30, "Prometheus to scrape every node")
    # an evaluation before every node's first scrape may have seen no leader: it clears at the next one
    wait_until(lambda: _alerts(scene) == [], 10, "no alert on the healthy cluster")
    victim = "n3"
    cluster.kill(victim)
    started = time.monotonic()
    overview = _api(scene, "overview")
    assert time.monotonic() - started < 2.0
    assert next(n for n in overview["nodes"] if n["id"] == victim)["state"] == "dead"
    urls = {"overview": scene.url("n1", "/"), "placement": scene.url("n2", "/placement")}
    pages = render(urls)
    with checking(pages["overview"], urls["overview"], tmp_path, "overview-after-kill") as page:
        dead = page.having(tag="tr", data_state="dead")
        assert [e["data-node"] for e in dead] == [victim], page.words
    with checking(pages["placement"], urls["placement"], tmp_path, "placement-after-kill") as page:
        assert f"{victim} (no answer)" in page.words
        assert page.having(tag="span", data_role="unknown")
    instance = f"127.0.0.1:{cluster.spec.node(victim).metrics_port}"

    def alerting() -> set[tuple[str, str]]:
        return {(a["labels"]["alertname"], a["labels"].get("instance", "")) for a in _alerts(scene)
                if a["state"] in ("pending", "firing")}

    wait_until(lambda: ("RaftkvNodeDown", instance) in alerting(), 15, "the node-down alert")
    wait_until(lambda: any(name == "RaftkvPartitionUnderReplicated" for name, _ in alerting()), 15,
               "an under-replicated partition's alert")
    assert ("RaftkvPartitionUnderReplicated", instance) not in alerting()  # a dead node judges nothing


def test_a_page_asked_of_a_node_whose_peer_hangs_answers_within_two_seconds(scene):
    hung = "n2"
    scene.cluster.signal(hung, signal.SIGSTOP)
    try:
        started = time.monotonic()
        placement = _api(scene, "placement", node="n1")
        took = time.monotonic() - started
    finally:
        scene.cluster.signal(hung, signal.SIGCONT)
    assert took < 2.0
    assert placement["answered"][hung] is False
    assert all(row["cells"][hung] == {"role": "unknown"} for row in placement["rows"])


def test_with_tls_the_console_is_https_asks_for_a_token_and_shows_what_the_role_may_read(make_cluster, tmp_path):
    cluster = make_cluster(nodes=1, partitions=1, replication=1, tls="metrics")
    with Client(cluster.endpoints, tls=cluster.tls, timeout=10) as admin:
        admin.change_topology(GrantPermission("reader", Permission("read", "")), everywhere=True)
        tokens = {}
        for name, role in (("rita", "reader"), ("ada", "root")):
            tokens[name] = secrets.token_urlsafe(16)
            admin.change_topology(PutUser(UserRecord(name, (role,), hashlib.sha256(tokens[name].encode()).hexdigest())),
                                  everywhere=True)
    node = cluster.spec.nodes[0]
    https = ssl.create_default_context(cafile=str(cluster.spec.tls.ca))

    def get(path: str, token: str | None = None) -> tuple[int, dict | bytes]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        status, body = _get(f"https://{node.host}:{node.metrics_port}{path}", headers=headers, context=https)
        return status, json.loads(body) if path.startswith("/api/") else body

    assert get("/metrics")[0] == 200 and b"raftkv_is_leader" in get("/metrics")[1]  # Prometheus needs no token
    assert get("/api/overview") == (401, {"error": "this console needs a user's token", "login": True})
    assert get("/api/overview", "wrong")[1]["error"] == "the token is no user's: revoked, or mistyped"
    status, who = get("/api/whoami", tokens["rita"])
    assert (status, who["user"], who["pages"]) == (200, "rita", ["overview", "placement", "partition", "series",
                                                                   "events"])
    assert get("/api/overview", tokens["rita"])[0] == 200
    assert get("/api/learners", tokens["rita"]) == (403, {"error": "permission denied: user rita may not run learners"})
    assert get("/api/learners", tokens["ada"])[0] == 200
    url = f"https://{node.host}:{node.metrics_port}/"
    page = Page(_chromium(url, "--ignore-certificate-errors", "--dump-dom"))
    try:
        form = page.having(tag="form", id="login")
        assert form and "hidden" not in form[0] and "needs a user's token" in page.words
        assert not page.having(tag="tr")  # nothing of the cluster without a token
    except AssertionError:
        _chromium(url, "--ignore-certificate-errors", f"--screenshot={tmp_path / 'login.png'}")
        raise
