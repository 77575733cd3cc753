"""The `raftkv` command: one click group, one module per command family.

Errors are turned into text and exit codes here and nowhere else: a raftkv
error (a user mistake or an unavailable cluster) prints one line to stderr
and exits 2; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import sys

import click

from raftkv.cli import backup, chaos, cluster, data, dev, feed, learner, node, status
from raftkv.cli.output import err_console
from raftkv.errors import RaftKVError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="raftkv")
def cli() -> None:
    """raftkv: a Raft-replicated, partitioned key-value store."""


for module in (backup, chaos, cluster, data, dev, feed, learner, node, status):
    module.register(cli)


def main() -> None:
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        err_console.print("aborted")
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(2)
    except RaftKVError as exc:
        err_console.print(f"error: {exc}", markup=False, soft_wrap=True)
        sys.exit(2)
