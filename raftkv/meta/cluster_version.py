"""The cluster version: the lowest release every member runs, once the metadata leader has heard it
from each (etcd's cluster version; docs/operations.md, "Upgrading"). Pure.

A feature that changes a format on disk or on the wire turns on only once the cluster version
reaches the release that brought it (`at_least`), so nodes of the release before keep working beside
the new ones during a rolling upgrade. The version only rises: once it has, a node of an older
release is refused (`refusal`), and until it has, a node may go back to the older release.

Learners read the same formats (the log's entries, snapshots, hub frames), so the version does not
rise above a registered learner's release either. A learner says which release it runs with a
`LearnerRelease` metadata command; the metadata keeps the last one per learner name. The command is
new in LEARNER_RELEASES_SINCE, so it is taken only once the cluster version says every member can
apply it: before that, a learner cannot report, and an unreported learner does not hold the version
back (the upgrade onto LEARNER_RELEASES_SINCE itself still wants learners upgraded before the last
node, docs/operations.md); from then on a registered learner that has not reported holds it back, as
a member that did not answer does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

from packaging.version import InvalidVersion, Version

from raftkv.core.errors import ChangeRefused

# What a node that reports no release runs (its Status had no version field yet), and the cluster
# version of metadata that holds none: the last release before releases were reported.
FIRST_RELEASE = "0.1.0"
# The first build of the node engine's frames (docs/raft-engine.md): `raft_engine = "auto"` turns the
# engine on once the cluster version reaches it.
NODE_ENGINE_SINCE = "0.2.0"
# The first build that knows `LearnerRelease`.
LEARNER_RELEASES_SINCE = "0.2.0"
# The first build whose engine knows the `rest` item (an idle group rests in the node engine; docs/raft-engine.md).
ENGINE_REST_SINCE = "0.3.0.dev0"


@dataclass(frozen=True)
class RaiseClusterVersion:
    """Every member runs `version` or newer: the metadata leader proposes it once it heard so from each,
    with what each said (the state machine checks them against the members it has)."""

    version: str
    releases: tuple[tuple[str, str], ...]  # (node id, release) of every member


@dataclass(frozen=True)
class LearnerRelease:
    """Learner `name` runs `release`: the cluster version stays at or below it while the learner is registered."""

    name: str
    release: str


def release(text: str) -> Version | None:
    """A reported release; "" is FIRST_RELEASE, anything not a version None."""
    try:
        return Version(text or FIRST_RELEASE)
    except InvalidVersion:
        return None


def at_least(cluster_version: str, version: str) -> bool:
    """Whether every member runs `version` or newer, as the cluster has recorded."""
    return release(cluster_version) >= Version(version)


def version_to_raise(cluster_version: str, members: Iterable[str], reported: Mapping[str, str],
                     learners: Mapping[str, str | None] | None = None) -> RaiseClusterVersion | None:
    """`members`: the nodes not removed; `reported`: each node that answered the metadata leader just now,
    and the release it runs; `learners`: each registered learner, and the release it last reported (None:
    none). The lowest release of the members and learners, if every member answered, every learner
    that counts has reported (see the module's doc), and it is above the cluster version; else None (a
    member that did not answer may still run an older release)."""
    members = list(members)
    if not members or any(m not in reported for m in members):
        return None
    counting = at_least(cluster_version, LEARNER_RELEASES_SINCE)
    learned = [r for r in (learners or {}).values() if r is not None or counting]
    if None in learned:
        return None
    releases = [release(reported[m]) for m in members] + [release(r) for r in learned]
    if None in releases:
        return None
    lowest = min(releases)
    if lowest <= release(cluster_version):
        return None
    return RaiseClusterVersion(str(lowest), tuple(sorted((m, reported[m]) for m in members)))


def learner_releases(cluster_version: str, known: tuple[tuple[str, str], ...],
                     command: LearnerRelease) -> tuple[tuple[str, str], ...]:
    """The learners' releases after `command`; ChangeRefused if the command is not taken yet, or the
    learner's release is older than the cluster version (as a node of it would be refused)."""
    if not at_least(cluster_version, LEARNER_RELEASES_SINCE):
        raise ChangeRefused(f"the cluster version is {cluster_version}: learners report their release from "
                            f"{LEARNER_RELEASES_SINCE} on, once every node runs it")
    if release(command.release) is None:
        raise ChangeRefused(f"{command.release!r} is not a release")
    if too_old := refusal(cluster_version, command.release, f"learner {command.name}"):
        raise ChangeRefused(too_old)
    return tuple(sorted({**dict(known), command.name: command.release}.items()))


def raised(cluster_version: str, members: Iterable[str], command: RaiseClusterVersion) -> str:
    """The cluster version after `command`; ChangeRefused if it would go down, or above a member's release."""
    new = release(command.version)
    if new is None:
        raise ChangeRefused(f"{command.version!r} is not a release")
    if new < release(cluster_version):
        raise ChangeRefused(f"the cluster version is {cluster_version}; it never goes down (to {command.version})")
    said = dict(command.releases)
    for member in members:
        if member not in said or (release(said[member]) or new) < new:
            raise ChangeRefused(f"{member} runs {said.get(member, 'an unknown release')}: the cluster version "
                                f"cannot rise to {command.version} before every member runs it")
    return str(new)


def refusal(cluster_version: str, mine: str, who: str = "this node") -> str | None:
    """One line if a node (or `who`) of release `mine` may not serve in a cluster at `cluster_version`, else None."""
    ours = release(mine)
    if ours is None or ours >= release(cluster_version):
        return None
    return (f"{who} runs raftkv {mine}, older than the cluster version {cluster_version} (every member ran "
            f"{cluster_version} or newer, and formats changed with it): start it with raftkv {cluster_version} "
            "or newer")
