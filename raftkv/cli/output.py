"""All CLI output goes through these two consoles."""

from rich.console import Console

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)
