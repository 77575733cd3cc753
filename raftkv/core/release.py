"""This build's release, in semantic versioning (CHANGELOG.md): what `raftkv --version` prints and each
node reports in `Status`."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    VERSION = version("raftkv")
except PackageNotFoundError:  # a source tree run without being installed
    VERSION = "0+unknown"
