"""The `raftkv` command: one click group, one module per command family.

A family's module is imported only when one of its commands runs (or
`--help` lists them all): `raftkv learner start` need not load the chaos
harness, and every process the CLI starts comes up that much sooner.

Errors are turned into text and exit codes here and nowhere else: a raftkv
error (a user mistake or an unavailable cluster) prints one line to stderr
and exits 2; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import importlib
import sys

import click

from raftkv.cli import output
from raftkv.core.errors import RaftKVError, one_line

# Made absolute here, where the current directory is the user's: a node that joins records them in its
# data dir's spec, whose relative paths are read against that dir.
_ABSOLUTE_FILE = click.Path(dir_okay=False, resolve_path=True)

COMMANDS = {  # command -> the module of raftkv.cli that defines it
    "backup": "backup", "certs": "certs", "chaos": "chaos", "cluster": "cluster", "dev": "dev", "feed": "feed",
    "learner": "learner", "node": "node", "status": "status", "user": "access", "role": "access",
    "replica": "replica", "rebalance": "replica", "leader": "replica",
    "put": "data", "get": "data", "delete": "data", "scan": "data",
}


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        return getattr(importlib.import_module(f"raftkv.cli.{COMMANDS[name]}"), name)


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    """--version, reading the release only then: importlib.metadata is no small import."""
    if value and not ctx.resilient_parsing:
        from raftkv.core.release import VERSION

        click.echo(f"raftkv, version {VERSION}")
        ctx.exit()


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_print_version,
              help="Show the version and exit.")
@click.option("--cacert", envvar="RAFTKV_CACERT", type=_ABSOLUTE_FILE, default=None,
              help="The cluster CA (PEM); default: the spec's [tls] ca.")
@click.option("--cert", envvar="RAFTKV_CERT", type=_ABSOLUTE_FILE, default=None,
              help="Client certificate (PEM) to present; default: the spec's [tls] client_cert.")
@click.option("--key", envvar="RAFTKV_KEY", type=_ABSOLUTE_FILE, default=None,
              help="Its private key (PEM).")
@click.option("--token", envvar="RAFTKV_TOKEN", default=None, show_envvar=True,
              help="Act as the user this bearer token belongs to (`raftkv user add --token`); prefer the "
                   "environment variable, which does not show in the process list.")
def cli(cacert: str | None, cert: str | None, key: str | None, token: str | None) -> None:
    """raftkv: a Raft-replicated, partitioned key-value store.

    With TLS (the default of `cluster init` and `dev up`), commands present the client certificate the
    spec names, or the one given here: raftkv --cert user-alice.pem --key user-alice.key get k"""


def main() -> None:
    if hasattr(sys.stdout, "reconfigure"):  # names and paths in argv that are not UTF-8 are echoed escaped
        sys.stdout.reconfigure(errors="backslashreplace")
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        output.err_console.print("aborted")
        sys.exit(130)
    except click.ClickException as exc:
        exc.message = one_line(exc.message)
        exc.show()
        sys.exit(2)
    except RaftKVError as exc:
        output.err_console.print(f"error: {one_line(str(exc))}", markup=False, soft_wrap=True)
        sys.exit(2)
