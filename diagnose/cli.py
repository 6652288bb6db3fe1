"""The ``diagnose`` command line: parse, wire, print, exit. No logic lives here.

``diagnose PATH...`` is the scan (the group routes anything that is not a subcommand to
``scan``), so the design card's ``diagnose logs/run.out`` and ``diagnose --fix cfg.yaml
--relaunch`` work as written. Subcommands live in ``diagnose/commands/<name>.py``.
"""
from __future__ import annotations

import click

from . import __version__, commands, exitcodes
from .errors import DiagnoseError


def _looks_like_command(word: str) -> bool:
    """A misspelt subcommand (``chek``): no such path, and close to a command's name."""
    import difflib
    import os

    return not os.path.exists(word) and bool(difflib.get_close_matches(word, list(commands.REGISTRY), n=1,
                                                                       cutoff=0.7))


class DefaultGroup(click.Group):
    """A group whose default command is ``scan``."""

    default_command = "scan"

    def parse_args(self, ctx, args):
        if args and args[0] not in commands.REGISTRY and not args[0].startswith("-") and _looks_like_command(args[0]):
            import difflib

            near = difflib.get_close_matches(args[0], list(commands.REGISTRY), n=1, cutoff=0.7)
            raise click.UsageError(f"{args[0]!r} is neither a file nor a command; did you mean "
                                   f"'diagnose {near[0]}'?", ctx)
        if not args or (args[0] not in commands.REGISTRY and args[0] not in ("--help", "-h", "--version", "-V")):
            args = [self.default_command, *args]
            ctx.meta["diagnose.implied_scan"] = True  # shell completion offers the subcommands here
        return super().parse_args(ctx, args)

    # subcommands are imported when used (commands.load)
    def list_commands(self, ctx):
        return list(commands.REGISTRY)

    def get_command(self, ctx, name):
        return commands.load(name) if name in commands.REGISTRY else None

    def format_usage(self, ctx, formatter):
        formatter.write_usage("diagnose", "[PATH]... [OPTIONS] | COMMAND [ARGS]...")


@click.group(cls=DefaultGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
             epilog=exitcodes.HELP)
@click.version_option(__version__, "-V", "--version", prog_name="diagnose")
def cli():
    """Diagnose failed Megatron-Core / Megatron-Bridge training runs.

    \b
      diagnose logs/run.out                     scan a log (files, folders, .gz, - for stdin)
      diagnose logs/run.out --fix cfg.yaml      plan and apply a fix to the config
      diagnose logs/ --fix cfg.yaml --relaunch  ...then relaunch, follow, repeat
      diagnose check cfg.yaml [key=value ...]   preflight a config before any GPU is spent
      diagnose signatures list|show ID|test     the signature database

    The scan's options (--format, --config, --baseline, --fix, --relaunch, -v ...) are listed
    by 'diagnose scan --help'.
    """


def main(argv=None):
    try:
        rv = cli.main(args=argv, prog_name="diagnose", standalone_mode=False)
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.ClickException as exc:
        exc.show()
        return exitcodes.USAGE
    except click.exceptions.Abort as exc:  # click turns a KeyboardInterrupt into Abort
        signum = getattr(exc.__cause__ or exc.__context__, "signum", None)
        click.echo("Aborted." if not signum else f"Terminated ({exc.__cause__ or exc.__context__}).", err=True)
        return 128 + int(signum or 2)
    except KeyboardInterrupt as exc:  # Ctrl-C; SIGTERM / SIGHUP while relaunching (launch/loop.py Terminated)
        click.echo("Interrupted." if not getattr(exc, "signum", None) else f"Terminated ({exc}).", err=True)
        return 128 + int(getattr(exc, "signum", 2))
    except BrokenPipeError:
        return exitcodes.OK
    except DiagnoseError as exc:  # a user's error no command translated: one line, its exit code
        click.echo(f"Error: {exc}", err=True)
        return exc.exit_code
    except Exception as exc:  # noqa: BLE001 - a bug: one line for the user, the traceback only on request
        import os
        import traceback

        if os.environ.get("DIAGNOSE_DEBUG"):
            traceback.print_exc()
        click.echo(f"diagnose: internal error: {type(exc).__name__}: {exc} (set DIAGNOSE_DEBUG=1 for the traceback)",
                   err=True)
        return exitcodes.INTERNAL
    return rv if isinstance(rv, int) else exitcodes.OK

