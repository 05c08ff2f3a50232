"""What a ``jobs`` subcommand is, and the output both kinds of reader get from it."""

from __future__ import annotations

import io
import json
import shutil
from collections.abc import Sequence
from typing import Any, ClassVar

from django.core.management.base import CommandParser, OutputWrapper
from rich.console import Console
from rich.table import Table


class Output:
    """JSON for scripts (``--json``), rich tables for people, both on the command's stdout."""

    def __init__(self, stdout: OutputWrapper, *, as_json: bool) -> None:
        self.stdout = stdout
        self.as_json = as_json

    def json(self, data: Any) -> None:
        self.stdout.write(json.dumps(data, indent=2))

    def table(self, title: str, headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
        table = Table(title=title)
        for header in headers:
            table.add_column(header, overflow="fold")
        for row in rows:
            table.add_row(*row)
        self._print(table)

    def _print(self, renderable: Any) -> None:
        # Rendered to text first: Django's OutputWrapper (what tests capture) ends every write
        # with a newline, so rich must not write to it piecemeal. Not a terminal: wide rows.
        width = shutil.get_terminal_size().columns if self.stdout.isatty() else 160
        buffer = io.StringIO()
        Console(file=buffer, width=width, highlight=False).print(renderable)
        self.stdout.write(buffer.getvalue(), ending="")


class Subcommand:
    name: ClassVar[str]
    help: ClassVar[str]
    json_option: ClassVar[bool] = False

    def add_arguments(self, parser: CommandParser) -> None:
        """Options of this subcommand (``--json`` is added when ``json_option`` is set)."""

    def run(self, options: dict[str, Any], out: Output) -> None:
        """Do the work; raise CommandError (message with a hint) on bad input."""
        raise NotImplementedError
