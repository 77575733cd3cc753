"""`raftkv learner start`, with a timestamped trace of its start-up on stderr (for learner_start.py).

    python scripts/learner_start_trace.py learner start --name L --config cluster.toml

runs exactly what `python -m raftkv learner start ...` runs, and writes
`TRACE <milestone> <time.time()> <time.process_time()>` lines to stderr (the wall clock, and this
process's CPU seconds so far) as the start-up passes each milestone. The milestones are hooked as
their modules are imported (an import hook patches a module right after it ran), so the trace imports
nothing that the command would not import itself, and in the same order.
"""

from __future__ import annotations

import sys
import time

_INTERPRETER = time.time(), time.process_time()  # the wrapper's first line: the interpreter and site are up

import functools  # noqa: E402
import importlib.abc  # noqa: E402
import importlib.machinery  # noqa: E402

_seen: set[str] = set()


def mark(name: str, at: tuple[float, float] | None = None) -> None:
    if name in _seen:
        return
    _seen.add(name)
    wall, cpu = at or (time.time(), time.process_time())
    sys.stderr.write(f"TRACE {name} {wall:.6f} {cpu:.6f}\n")
    sys.stderr.flush()


def _timed(fn, name: str):
    """Milestones `<name>:start` and `<name>:end` around the first call of fn (async or not)."""
    import inspect

    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def wrapper(*args, **kwargs):
            mark(f"{name}:start")
            try:
                return await fn(*args, **kwargs)
            finally:
                mark(f"{name}:end")
    else:
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            mark(f"{name}:start")
            try:
                return fn(*args, **kwargs)
            finally:
                mark(f"{name}:end")
    return wrapper


def _sink(sink):
    """The sink's open and recover, timed."""
    for method in ("open", "recover"):
        setattr(sink, method, _timed(getattr(sink, method), f"sink.{method}"))
    return sink


def _patch_learner_process(module) -> None:
    for name in ("registration", "_topology"):
        if hasattr(module, name):
            setattr(module, name, _timed(getattr(module, name), name.lstrip("_")))
    serve = module.serve

    @functools.wraps(serve)
    async def traced_serve(*args, **kwargs):
        mark("serve:start")
        return await serve(*args, **kwargs)
    module.serve = traced_serve
    load_sink = module.load_sink
    module.load_sink = lambda *a, **kw: _sink(_timed(load_sink, "load_sink")(*a, **kw))
    if hasattr(module, "_open_engines"):  # the databases open in worker threads, apart from the groups
        engine, opened = module.RocksEngine, [0]

        def traced_engine(*args, **kwargs):
            mark("a database open:start")
            result = engine(*args, **kwargs)
            opened[0] += 1
            mark(f"database {opened[0]} open:end")
            return result
        module.RocksEngine = traced_engine


def _patch_feed_pump(module) -> None:
    deliver = module._deliver_and_flush

    def traced(sink, batch):
        mark("first delivery:start")
        result = deliver(sink, batch)
        mark("first delivery:end")
        return result
    module._deliver_and_flush = traced
    run = module.FeedPump.run

    async def traced_run(self, *args, **kwargs):
        mark("pump.run")
        return await run(self, *args, **kwargs)
    module.FeedPump.run = traced_run


def _patch_learner_replica(module) -> None:
    init = module.LearnerReplica.__init__
    opened = [0]

    def traced_init(self, *args, **kwargs):
        mark(f"replica {opened[0] + 1} open:start")
        init(self, *args, **kwargs)
        opened[0] += 1
        mark(f"replica {opened[0]} open:end")
    module.LearnerReplica.__init__ = traced_init
    committed = module.LearnerReplica.committed_entries

    def traced_committed(self, *args, **kwargs):
        entries = committed(self, *args, **kwargs)
        if entries:
            mark("first committed entries")
        return entries
    module.LearnerReplica.committed_entries = traced_committed


PATCHES = {"learners.learner_process": _patch_learner_process, "learners.feed_pump": _patch_feed_pump,
           "learners.learner_replica": _patch_learner_replica}
LOADED = ("raftkv.cli", "raftkv.cli.learner", "learners.learner_process", "uvloop", "grpc")


class _Hook(importlib.abc.MetaPathFinder):
    """Marks when some modules finished importing and patches others right after they ran."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in PATCHES and fullname not in LOADED:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def traced_exec(module):
            exec_module(module)
            if fullname in PATCHES:
                PATCHES[fullname](module)
            mark(f"imported {fullname}")
        spec.loader.exec_module = traced_exec
        return spec


def main() -> None:
    mark("interpreter", at=_INTERPRETER)
    sys.meta_path.insert(0, _Hook())
    sys.argv = ["raftkv", *sys.argv[1:]]
    from raftkv.cli import main as cli_main
    cli_main()


if __name__ == "__main__":
    main()
