"""A learner's release and the cluster version (raftkv/meta/cluster_version.py, docs/operations.md
"Upgrading"): a learner older than the cluster version does not start, and a running one reports its
release to the metadata (`LearnerRelease`), so the version does not rise above what it can read."""

from __future__ import annotations

import asyncio
import logging
from typing import Callable

from raftkv.client.async_client import AsyncClient
from raftkv.core.errors import ConfigError, RaftKVError, Unavailable
from raftkv.core.release import VERSION
from raftkv.meta.cluster_version import LEARNER_RELEASES_SINCE, LearnerRelease, at_least, refusal
from raftkv.meta.records import ClusterMeta

log = logging.getLogger(__name__)


def check_release(meta: ClusterMeta, release: str = VERSION) -> None:
    if too_old := refusal(meta.cluster_version, release, "this learner"):
        raise ConfigError(too_old, source="learner start")


async def report_release(client: AsyncClient, name: str, meta: Callable[[], ClusterMeta], stop: asyncio.Event,
                         every: float = 1.0, release: str = VERSION) -> None:
    """Once, as soon as the cluster version takes the command (`meta`: the metadata as last read);
    tried again every `every` seconds while the metadata leader cannot be reached."""
    refused = ""
    while not stop.is_set():
        if at_least(meta().cluster_version, LEARNER_RELEASES_SINCE):
            try:
                await client.change_topology(LearnerRelease(name, release))
                log.info("reported release %s to the cluster's metadata", release)
                return
            except Unavailable:
                pass  # no node answers: _follow_meta says so
            except RaftKVError as exc:  # refused (ChangeRefused, PermissionDenied): said once, tried again
                if str(exc) != refused:
                    log.warning("the cluster refused this learner's release: %s", exc)
                    refused = str(exc)
        try:
            await asyncio.wait_for(stop.wait(), every)
        except asyncio.TimeoutError:
            pass
