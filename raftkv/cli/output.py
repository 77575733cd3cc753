"""All CLI output goes through these two consoles.

Markup is off: what they print quotes keys, names and paths users chose, and `[/]` in one would
be a markup error. A styled part is a rich Text.
"""

from rich.console import Console

console = Console(highlight=False, markup=False)
err_console = Console(stderr=True, highlight=False, markup=False)
