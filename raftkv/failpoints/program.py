"""What an armed fail point does on each hit: the setting's grammar and its decisions. Pure: no I/O.

A setting is fail-rs's, cut to what raftkv needs::

    setting := term ("->" term)*
    term    := [PERCENT "%"] [COUNT "*"] task ["(" ARG ")"]
    task    := off | crash | delay | error

Terms run in order: a term acts on a hit with probability PERCENT (default 100) and is used
up after COUNT hits it acted on (default: never); then the next term takes over. So
``20*off->crash`` lets 20 hits pass and crashes on the 21st, and ``10%delay(50)`` sleeps
50 ms on one hit in ten.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

TASKS = ("off", "crash", "delay", "error")
_TERM = re.compile(r"^(?:(?P<percent>\d+(?:\.\d+)?)%)?(?:(?P<count>\d+)\*)?(?P<task>[a-z]+)(?:\((?P<arg>[^()]*)\))?$")


class SettingError(ValueError):
    """A fail point setting that does not parse; the message says which part and why."""


@dataclass(frozen=True)
class Action:
    """What a hit does: `crash` (SIGKILL of the process), `delay` (sleep `millis`), `error` (raise EIO)."""

    task: str
    millis: float = 0.0


@dataclass
class _Term:
    action: Action
    percent: float
    remaining: int | None  # hits it may still act on; None: unlimited


@dataclass
class Program:
    """One fail point's terms and how far through them it is."""

    terms: list[_Term] = field(default_factory=list)

    def next(self, rng: random.Random) -> Action | None:
        """The action for this hit, or None to pass (an `off` term or a lost coin toss)."""
        while self.terms and self.terms[0].remaining == 0:
            self.terms.pop(0)
        if not self.terms:
            return None
        term = self.terms[0]
        if term.percent < 100 and rng.random() * 100 >= term.percent:
            return None
        if term.remaining is not None:
            term.remaining -= 1
        return None if term.action.task == "off" else term.action


def parse(setting: str) -> Program:
    """`setting` as a Program; SettingError names the part that is wrong."""
    terms = []
    for text in setting.split("->"):
        text = text.strip()
        match = _TERM.match(text)
        if match is None or match["task"] not in TASKS:
            raise SettingError(f"'{text}' is not [P%][N*]TASK[(ARG)] with TASK one of {', '.join(TASKS)}")
        task, arg = match["task"], match["arg"]
        percent = float(match["percent"] or 100)
        if not 0 < percent <= 100:
            raise SettingError(f"'{text}': the percentage must be above 0 and at most 100")
        if task == "delay":
            try:
                millis = float(arg or "")
            except ValueError:
                raise SettingError(f"'{text}': delay needs milliseconds, as in delay(50)") from None
            if millis < 0:
                raise SettingError(f"'{text}': the delay may not be negative")
        elif arg is not None:
            raise SettingError(f"'{text}': {task} takes no argument")
        else:
            millis = 0.0
        count = match["count"]
        terms.append(_Term(Action(task, millis), percent, int(count) if count is not None else None))
    return Program(terms)


def parse_settings(text: str, names: tuple[str, ...]) -> dict[str, str]:
    """`name=setting;name=setting` (RAFTKV_FAILPOINTS) as a dict, each setting checked to parse."""
    settings = {}
    for item in filter(None, (part.strip() for part in text.split(";"))):
        name, sep, setting = item.partition("=")
        name = name.strip()
        if not sep:
            raise SettingError(f"'{item}' is not NAME=SETTING")
        if name not in names:
            raise SettingError(f"no fail point '{name}'; the fail points are {', '.join(names)}")
        parse(setting)
        settings[name] = setting.strip()
    return settings
