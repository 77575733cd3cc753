"""raftkv user add | remove | list, raftkv role grant | revoke | list: who may do what (docs/security.md §5).

Users and roles live in the cluster's metadata, so a change reaches every node with its next entry.
They are checked on clusters with TLS; each of these commands needs admin on every key (the `root`
role, which the `admin` user of `cluster init` holds).
"""

from __future__ import annotations

import hashlib
import json
import secrets

import click
from rich.table import Table

from raftkv.cli.options import UTF8, config_option, endpoints_option, json_option, open_client
from raftkv.cli.output import console
from raftkv.meta.access import GrantPermission, Permission, PutUser, RemoveUser, RevokePermission, UserRecord


@click.group()
def user() -> None:
    """Users: their roles, and bearer tokens for clients without a certificate of their own."""


@user.command("add")
@click.argument("name")
@click.option("--role", "roles", multiple=True, metavar="ROLE", help="A role the user holds; repeatable.")
@click.option("--token", "make_token", is_flag=True,
              help="Make a new bearer token for the user (printed once; only its SHA-256 is kept).")
@config_option
@endpoints_option
def add_user(name: str, roles: tuple[str, ...], make_token: bool, config: str, endpoints: str | None) -> None:
    """Add NAME, or set the roles of an existing user (keeping its token unless --token)."""
    token = secrets.token_urlsafe(32) if make_token else None
    record = UserRecord(name, roles, hashlib.sha256(token.encode()).hexdigest() if token else "")
    with open_client(config, endpoints, timeout=15.0) as kv:
        kv.change_topology(PutUser(record, keep_token=token is None), everywhere=True)  # its token works at once
    console.print(f"user {name}: roles {', '.join(roles) or 'none'}")
    if token:
        console.print(f"token (shown once; give it as RAFTKV_TOKEN or token=): {token}", soft_wrap=True)


@user.command("remove")
@click.argument("name")
@config_option
@endpoints_option
def remove_user(name: str, config: str, endpoints: str | None) -> None:
    """Remove NAME: its token stops working on every node with the next metadata entry."""
    with open_client(config, endpoints, timeout=15.0) as kv:
        kv.change_topology(RemoveUser(name), everywhere=True)
    console.print(f"user {name} removed")


@user.command("list")
@config_option
@endpoints_option
@json_option
def list_users(config: str, endpoints: str | None, as_json: bool) -> None:
    """The users, their roles, and whether each has a token."""
    with open_client(config, endpoints, timeout=10.0) as kv:
        users = kv.topology().meta.users
    rows = [{"name": u.name, "roles": list(u.roles), "token": bool(u.token_sha256)} for u in users]
    if as_json:
        console.print_json(json.dumps(rows))
        return
    table = Table(title="raftkv users")
    for column in ("user", "roles", "token"):
        table.add_column(column)
    for r in rows:
        table.add_row(r["name"], ", ".join(r["roles"]) or "-", "yes" if r["token"] else "no")
    console.print(table)


@click.group()
def role() -> None:
    """Roles: read, write or admin on key prefixes (each level includes the ones below)."""


prefix_option = click.option("--prefix", type=UTF8, default="", show_default=True,
                             help="Keys starting with this text (UTF-8); empty: every key.")


@role.command("grant")
@click.argument("name")
@click.option("--access", type=click.Choice(["read", "write", "admin"]), required=True)
@prefix_option
@config_option
@endpoints_option
def grant(name: str, access: str, prefix: str, config: str, endpoints: str | None) -> None:
    """Let role NAME read, write or administer the keys under --prefix (replacing its grant there)."""
    with open_client(config, endpoints, timeout=15.0) as kv:
        kv.change_topology(GrantPermission(name, Permission(access, prefix.encode().hex())), everywhere=True)
    console.print(f"role {name}: {access} on {_shown(prefix)}")


@role.command("revoke")
@click.argument("name")
@prefix_option
@config_option
@endpoints_option
def revoke(name: str, prefix: str, config: str, endpoints: str | None) -> None:
    """Take back role NAME's grant on --prefix."""
    with open_client(config, endpoints, timeout=15.0) as kv:
        kv.change_topology(RevokePermission(name, prefix.encode().hex()), everywhere=True)
    console.print(f"role {name}: nothing on {_shown(prefix)}")


@role.command("list")
@config_option
@endpoints_option
@json_option
def list_roles(config: str, endpoints: str | None, as_json: bool) -> None:
    """The roles and their grants (the built-in `root` is admin on every key)."""
    with open_client(config, endpoints, timeout=10.0) as kv:
        roles = kv.topology().meta.roles
    rows = [{"name": r.name, "grants": [{"access": p.access, "prefix": bytes.fromhex(p.prefix).decode(
        "utf-8", errors="backslashreplace")} for p in r.permissions]} for r in roles]
    if as_json:
        console.print_json(json.dumps(rows))
        return
    table = Table(title="raftkv roles")
    table.add_column("role")
    table.add_column("grants")
    table.add_row("root", "admin on every key (built in)")
    for r in rows:
        table.add_row(r["name"], "; ".join(f"{g['access']} on {_shown(g['prefix'])}" for g in r["grants"]))
    console.print(table)


def _shown(prefix: str) -> str:
    return f"keys starting {prefix!r}" if prefix else "every key"
