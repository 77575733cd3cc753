"""raftkv replica move, raftkv rebalance, raftkv leader transfer: where replicas and leaders are."""

from __future__ import annotations

import contextlib
import time
from typing import Callable

import click
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from raftkv.cli.options import config_option, endpoints_option, open_client
from raftkv.client.sync_client import Client
from raftkv.cli.output import console
from raftkv.core.errors import ChangeRefused, Unavailable
from raftkv.core.spec import Tuning
from raftkv.core.spec_toml import load_spec
from raftkv.meta.planner import PlannedMove, PlannedTransfer, leaders_from, plan
from raftkv.meta.records import ClusterMeta, group_name


def wait_for(kv: Client, done: Callable[[ClusterMeta], bool], timeout: float,
             describe: Callable[[ClusterMeta], str], quiet: bool = False) -> ClusterMeta:
    """Poll the topology until `done`, showing `describe` on a status line (unless `quiet`: the caller
    shows progress its own way, and `describe` only names what is left if the time runs out)."""
    deadline = time.monotonic() + timeout
    with contextlib.nullcontext() if quiet else console.status("") as status:
        while not done(meta := kv.topology().meta):
            if time.monotonic() > deadline:
                raise Unavailable(f"still not done after {timeout:.0f}s ({describe(meta)}); it goes on: see "
                                  "`raftkv node list`")
            text = describe(meta)
            if status is not None:
                status.update(Text(text))  # quotes node ids: never markup
            time.sleep(0.5)
    return meta


def leaders_of(kv: Client) -> dict[int, str]:
    return leaders_from((s.node_id, ps.partition, ps.role, ps.term) for s in kv.status() for ps in s.partitions)


@click.group()
def replica() -> None:
    """Move partition replicas between nodes."""


@replica.command()
@config_option
@endpoints_option
@click.option("--partition", "-p", type=click.IntRange(0), required=True)
@click.option("--from", "source", required=True, help="The node that holds the replica now.")
@click.option("--to", "target", required=True, help="The node to hold it instead.")
@click.option("--wait/--no-wait", default=True, show_default=True, help="Wait until the move is done.")
@click.option("--timeout", type=click.FloatRange(min=1), default=600, show_default=True,
              help="How long --wait waits, in seconds.")
def move(config: str, endpoints: str | None, partition: int, source: str, target: str, wait: bool,
         timeout: float) -> None:
    """Move one replica: the new one catches up as a learner, joins the group, then the old one leaves.

    The group keeps its replication factor of up-to-date voters throughout.
    """
    with open_client(config, endpoints, timeout=15.0) as kv:
        kv.move_replica(partition, source, target)
        console.print(f"moving partition {partition}: {source} -> {target}")
        if not wait:
            return
        meta = wait_for(kv, lambda meta: meta.move_of(partition) is None, timeout,
                        lambda meta: f"partition {partition}: {meta.move_of(partition).step.value.replace('_', ' ')} "
                                     f"on {target}")
    console.print(f"partition {partition} moved; its replicas are on {', '.join(meta.placement[partition])}")


@click.command()
@config_option
@endpoints_option
@click.option("--dry-run", is_flag=True, help="Print the plan and change nothing.")
@click.option("--timeout", type=click.FloatRange(min=1), default=1800, show_default=True)
def rebalance(config: str, endpoints: str | None, dry_run: bool, timeout: float) -> None:
    """Even out replicas and leaders across the nodes that are up, now.

    The metadata leader does the same by itself every `tuning.rebalance_interval` seconds; this shows
    the plan, or runs it to the end with a progress bar.
    """
    tuning = load_spec(config).tuning if endpoints is None else Tuning()
    with open_client(config, endpoints, timeout=15.0) as kv:
        actions = plan(kv.topology().meta, leaders_of(kv), max_moves=10**6, max_moves_per_node=10**6)
        if dry_run or not actions:
            _print_plan(actions)
            return
        moves = [a for a in actions if isinstance(a, PlannedMove)]
        with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                      TimeElapsedColumn(), console=console) as progress:
            task = progress.add_task("moving replicas", total=len(moves))
            deadline = time.monotonic() + timeout
            pending = list(moves)
            while (meta := kv.topology().meta).moves or pending:
                if time.monotonic() > deadline:
                    raise Unavailable(f"rebalance not done after {timeout:.0f}s; it goes on: see `raftkv node list`")
                busy = {m.source for m in meta.moves} | {m.target for m in meta.moves}
                for action in list(pending):
                    under_way = sum(m.group >= 0 for m in meta.moves)
                    if under_way >= tuning.max_moves or {action.source, action.target} & busy:
                        continue
                    pending.remove(action)
                    try:
                        meta = kv.move_replica(action.partition, action.source, action.target).meta
                        busy |= {action.source, action.target}
                    except ChangeRefused as refused:  # the metadata leader's own rebalancing got there first
                        console.print(f"skipped: {refused}")
                progress.update(task, completed=len(moves) - len(pending) - sum(m.group >= 0 for m in meta.moves))
                time.sleep(0.5)
            progress.update(task, completed=len(moves))
        for action in plan(kv.topology().meta, leaders_of(kv)):
            if isinstance(action, PlannedTransfer):
                kv.transfer_leadership(action.partition, action.target)
    console.print("balanced")


def _print_plan(actions: list) -> None:
    if not actions:
        console.print("balanced: nothing to do")
        return
    table = Table(title="rebalance plan")
    for column in ("action", "group", "from", "to"):
        table.add_column(column)
    for a in actions:
        kind = "move replica" if isinstance(a, PlannedMove) else "transfer leadership"
        table.add_row(kind, group_name(a.partition), a.source or "-", a.target or "-")
    console.print(table)


@click.group()
def leader() -> None:
    """Partition leadership."""


@leader.command()
@config_option
@endpoints_option
@click.option("--partition", "-p", type=click.IntRange(0), required=True)
@click.option("--to", "target", required=True, help="A node holding a replica of the partition.")
@click.option("--timeout", type=click.FloatRange(min=1), default=30, show_default=True)
def transfer(config: str, endpoints: str | None, partition: int, target: str, timeout: float) -> None:
    """Hand a partition's leadership to another of its replicas."""
    with open_client(config, endpoints, timeout=15.0) as kv:
        placement = kv.topology().meta.placement
        voters = placement[partition] if partition < len(placement) else ()
        if target not in voters:
            raise ChangeRefused(f"{target} holds no replica of partition {partition}"
                                + (f"; its replicas are on {', '.join(voters)}" if voters else ""))
        deadline = time.monotonic() + timeout
        while leaders_of(kv).get(partition) != target:
            if time.monotonic() > deadline:
                raise Unavailable(f"partition {partition}: {target} did not take over within {timeout:.0f}s "
                                  "(it must hold every committed entry first); try again")
            kv.transfer_leadership(partition, target)
            time.sleep(0.5)
    console.print(f"partition {partition} is led by {target}")

