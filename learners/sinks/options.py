"""Reading a sink's options: text in, typed values out, every problem named. Pure.

Options arrive as text (`--option k=v`, the learner registry). Each sink
declares a frozen dataclass of its options and builds it with one
`OptionReader`, which collects every problem and raises them together as one
ConfigError, so an operator fixes them in one go:

    read = OptionReader(config, "kafka sink", known={"topic", ...}, prefixes=("producer.",))
    options = KafkaOptions(topic=read.text("topic", required=True), ...)
    read.done()
"""

from __future__ import annotations

from typing import Iterable, Mapping

from learners.change_event import max_json_bytes
from raftkv.core.errors import ConfigError

_TRUE, _FALSE = {"true", "1", "yes", "on"}, {"false", "0", "no", "off"}
# Every learner passes its name, its cluster's id (made at bootstrap) and the size limits of the cluster's
# events (`limits`) to its sink; a sink may use them or not.
COMMON = frozenset({"learner", "cluster_id", "max_key_bytes", "max_event_bytes"})


def limits(cluster: str, max_key_bytes: int, max_value_bytes: int) -> dict[str, str]:
    """The common options that tell a sink how large the cluster's keys and events can be."""
    return {"max_key_bytes": str(max_key_bytes),
            "max_event_bytes": str(max_json_bytes(cluster, max_key_bytes, max_value_bytes))}


class OptionReader:
    def __init__(self, config: Mapping[str, str], source: str, known: Iterable[str], prefixes: tuple[str, ...] = ()):
        self._config = {k: str(v) for k, v in config.items()}
        self._source = source
        self.problems: list[str] = []
        known = set(known) | COMMON
        for name in sorted(self._config):
            if name not in known and not name.startswith(prefixes):
                listed = ", ".join(sorted(known - COMMON) + [f"{p}*" for p in prefixes])
                self.problems.append(f"unknown option {name!r} (known: {listed})")

    def text(self, name: str, default: str = "", required: str | None = None) -> str:
        """The stripped value; `required` says what to give when it is missing or empty."""
        value = self._config.get(name, default).strip()
        if not value and required:
            self.problems.append(f"option {name!r} is required: {required}")
        return value

    def boolean(self, name: str, default: bool) -> bool:
        value = self._config.get(name, str(default)).strip().lower()
        if value not in _TRUE | _FALSE:
            self.problems.append(f"option {name!r}: expected true or false, got {self._config[name]!r}")
            return default
        return value in _TRUE

    def integer(self, name: str, default: int, minimum: int) -> int:
        return int(self._number(name, default, minimum, int))

    def number(self, name: str, default: float, minimum: float) -> float:
        return float(self._number(name, default, minimum, float))

    def _number(self, name: str, default: float, minimum: float, kind: type) -> float:
        raw = self._config.get(name)
        if raw is None:
            return default
        try:
            value = kind(raw.strip())
        except ValueError:
            self.problems.append(f"option {name!r}: expected {'an integer' if kind is int else 'a number'}, "
                                 f"got {raw!r}")
            return default
        if value < minimum:
            self.problems.append(f"option {name!r}: must be at least {minimum}, got {value}")
            return default
        return value

    def prefixed(self, prefix: str) -> dict[str, str]:
        """The options under `prefix`, with the prefix taken off."""
        return {k[len(prefix):]: v for k, v in self._config.items() if k.startswith(prefix)}

    def problem(self, text: str) -> None:
        self.problems.append(text)

    def done(self) -> None:
        """Raise every problem found, as one ConfigError."""
        if self.problems:
            raise ConfigError(self.problems, source=self._source)
