"""upgrade_check.py, part 1: the older release, from a git worktree, run by this interpreter.

    with OldRelease(repo, "c191d37", folder) as old:   # git worktree add --detach; removed at the end
        old.env                                       # {"PYTHONPATH": <its tree>}: a process of that release
        old.unmet()                                   # its setup.cfg requirements this environment lacks

Every process of either release is `python -m raftkv ...` with PYTHONPATH naming its tree. `-m` puts the
working directory first on sys.path, before PYTHONPATH: started from a source tree of raftkv, an
"old" process would import that tree's raftkv. So the processes run in a folder with no raftkv in it,
and `imported_from` checks where each release's raftkv comes from there.
"""

from __future__ import annotations

import configparser
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Callable

from packaging.requirements import InvalidRequirement, Requirement


class UsageError(Exception):
    """Bad input or an environment the check cannot run in: one line, exit code 2."""


def commit_of(repo: Path, revision: str) -> str:
    """The full hash of `revision` in `repo`; UsageError if it names no commit."""
    found = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}"],
                           capture_output=True, text=True)
    if found.returncode != 0:
        raise UsageError(f"--release {revision!r} is not a commit of {repo}: give a commit, tag or branch of it")
    return found.stdout.strip()


def unmet_requirements(setup_cfg: str, installed: Callable[[str], str | None]) -> list[str]:
    """One line per install_requires entry of `setup_cfg` (its text) that `installed(name)` (the version
    this environment has, or None) does not satisfy. Pure."""
    config = configparser.ConfigParser()
    config.read_string(setup_cfg)
    unmet = []
    for line in config.get("options", "install_requires", fallback="").splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            unmet.append(f"{line} (not a requirement this check can read)")
            continue
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue
        have = installed(requirement.name)
        if have is None or not requirement.specifier.contains(have, prereleases=True):
            unmet.append(f"{requirement} (this environment has {have or 'none'})")
    return unmet


def installed_version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def imported_from(env: dict[str, str], cwd: Path) -> Path:
    """Where `import raftkv` finds raftkv for a process of this interpreter with `env`, started in `cwd`."""
    found = subprocess.run([sys.executable, "-c", "import raftkv; print(raftkv.__file__)"], capture_output=True,
                           text=True, env=env, cwd=cwd, timeout=60)
    if found.returncode != 0:
        raise UsageError(f"this interpreter cannot import raftkv with PYTHONPATH={env.get('PYTHONPATH')}: "
                         f"{(found.stderr.strip().splitlines() or ['no output'])[-1]}")
    return Path(found.stdout.strip()).resolve().parent.parent


class OldRelease:
    def __init__(self, repo: Path, commit: str, tree: Path):
        self.repo = repo
        self.commit = commit
        self.tree = tree

    @property
    def env(self) -> dict[str, str]:
        return {"PYTHONPATH": str(self.tree)}

    def __enter__(self) -> OldRelease:
        made = subprocess.run(["git", "-C", str(self.repo), "worktree", "add", "--detach", str(self.tree), self.commit],
                              capture_output=True, text=True, timeout=300)
        if made.returncode != 0:
            raise UsageError(f"git worktree add of {self.commit[:12]} failed: "
                             f"{(made.stderr.strip().splitlines() or ['no output'])[-1]}")
        self._own_metadata()
        return self

    def _setup(self) -> configparser.ConfigParser:
        setup = configparser.ConfigParser()
        setup.read_string((self.tree / "setup.cfg").read_text())
        return setup

    @property
    def reports(self) -> str:
        """The release its nodes report in `Status` ("" before 0.2: no such field)."""
        release = self._setup().get("metadata", "version", fallback="")
        return "" if not release or release.startswith("0.1") else release

    def _own_metadata(self) -> None:
        """The release's own package metadata, first on its PYTHONPATH: a release that reports its version
        (0.2 and later read it with importlib.metadata) would otherwise report this environment's install;
        with its own entry points (its sinks)."""
        if not (release := self.reports):
            return
        info = self.tree / f"raftkv-{release}.dist-info"
        info.mkdir(exist_ok=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: raftkv\nVersion: {release}\n")
        entry_points = configparser.ConfigParser()
        for group, lines in self._setup().items("options.entry_points"):
            entry_points[group] = dict(line.split("=", 1) for line in lines.strip().splitlines())
        with open(info / "entry_points.txt", "w") as out:
            entry_points.write(out)

    def __exit__(self, *exc) -> None:
        subprocess.run(["git", "-C", str(self.repo), "worktree", "remove", "--force", str(self.tree)],
                       capture_output=True, timeout=300)
        subprocess.run(["git", "-C", str(self.repo), "worktree", "prune"], capture_output=True, timeout=300)

    def unmet(self) -> list[str]:
        return unmet_requirements((self.tree / "setup.cfg").read_text(), installed_version)
