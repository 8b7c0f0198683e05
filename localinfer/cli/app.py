"""The `localinfer` command: a Typer root, one module per verb, and the one place
where errors become a single line on stderr."""

from __future__ import annotations

import os
import signal
import sys
import threading

import typer

try:  # typer >= 0.20 carries its own copy of click
    from typer._click.exceptions import ClickException, UsageError
except ImportError:  # older typer uses click itself
    from click.exceptions import ClickException, UsageError  # type: ignore[assignment]

from localinfer.errors import OutputClosed, UserError

app = typer.Typer(
    name="localinfer",
    help="Run GGUF language models on your own machine.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # our help says "[default: ...]" in words; Rich markup would take it for a tag and drop it
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _register() -> None:
    """Add the verbs once (main() may run many times in one process: the tests do)."""
    if app.registered_commands:
        return
    from localinfer.cli import bench, cache, chat, doctor, embed, eval, list, pull, quantize, rm, run, serve, show, worker

    for module in (run, chat, serve, worker, embed, pull, list, show, rm, cache, quantize, eval, bench, doctor):
        module.register(app)


def main(argv: list[str] | None = None) -> None:
    """Entry point. Library code raises; here a UserError or an OSError (a file the machine
    refused) becomes `error: ...` and exit 1, a usage error exit 2, Ctrl-C exit 130.
    LOCALINFER_DEBUG=1 keeps tracebacks."""
    debug = os.environ.get("LOCALINFER_DEBUG") == "1"
    try:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, signal.default_int_handler)  # cli/__init__.py silenced it while loading
        _register()
        command = typer.main.get_command(app)
        result = command.main(args=argv, prog_name="localinfer", standalone_mode=False)
    except UsageError as e:
        hint = f" (see '{e.ctx.command_path} --help')" if e.ctx else ""
        print(f"error: {e.format_message()}{hint}", file=sys.stderr)
        sys.exit(2)
    except ClickException as e:
        print(f"error: {e.format_message()}", file=sys.stderr)
        sys.exit(e.exit_code)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except (KeyboardInterrupt, typer.Abort):
        print(file=sys.stderr)
        sys.exit(130)
    except UserError as e:
        if debug:
            raise
        print(f"error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
    except (OutputClosed, BrokenPipeError):  # `localinfer run ... | head`: the reader has all it wanted
        _discard_stdout()
        sys.exit(0)
    except OSError as e:  # the machine, not our code: a name too long, a full disk, a permission
        if debug:
            raise
        where = f"{e.filename}: " if e.filename else ""
        print(f"error: {where}{e.strerror or e}", file=sys.stderr)
        sys.exit(1)
    sys.exit(result if isinstance(result, int) else 0)


def _discard_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's last flush at exit does not hit the
    closed pipe again and print 'Exception ignored ... BrokenPipeError' (Python's own advice)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


if __name__ == "__main__":
    main()
