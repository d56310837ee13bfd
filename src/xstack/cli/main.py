"""The ``xstack`` command: parses arguments (``cli.parser``) and runs the subcommand (``cli.commands``). Exit
codes as in design.md §5: 0 success, 1 failure, 2 usage error."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from rich.console import Console
from rich.markup import escape

from xstack.cli.commands import COMMANDS
from xstack.cli.parser import build_parser
from xstack.errors import ProgramFailedError, UsageError, XstackError


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code."""
    err = Console(stderr=True, highlight=False)
    try:
        args = build_parser().parse_args(argv)
        if args.command is None:
            build_parser().print_help()
            return 2
        return int(COMMANDS[args.command](args))
    except UsageError as exc:
        err.print(f"[red]error:[/] {escape(str(exc))}", markup=True, soft_wrap=True)
        return 2
    except XstackError as exc:
        err.print(f"[red]error:[/] {escape(str(exc))}", markup=True, soft_wrap=True)
        return exc.code if isinstance(exc, ProgramFailedError) else 1
    except BrokenPipeError:  # stdout's reader went away (xstack export STORE -o - | head): stop quietly
        _discard_stdout()
        return 1
    except OSError as exc:
        if exc.filename is None:  # not about a file the user named: a bug, keep its traceback
            raise
        err.print(f"[red]error:[/] {escape(f'{exc.filename}: {exc.strerror or exc}')}", markup=True, soft_wrap=True)
        return 1
    except KeyboardInterrupt:
        err.print("interrupted")
        return 130


def _discard_stdout() -> None:
    """Point stdout at /dev/null, so that flushing what is left in its buffer at exit raises nothing more (as
    rich does on a broken pipe)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def entry() -> None:
    """Console-script entry point."""
    sys.exit(main())
