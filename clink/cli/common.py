"""What both command lines share: one exit-code table, text or JSON output, options taken before or after the subcommand."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import click
from click.core import ParameterSource

from pool.durations import parse_duration
from snapshot.errors import (
    ClinkError,
    ConflictError,
    CorruptDataError,
    FencedError,
    InvalidArgumentError,
    LimitExceededError,
    NotFoundError,
    PermissionDeniedError,
    ResourceExhaustedError,
    UnauthenticatedError,
    UnavailableError,
    UnsupportedFormatVersionError,
    lookup_by_class,
)

# --- exit codes: one table for clink and clink-pool --------------------------------------------------------

EXIT_OK = 0
EXIT_NEGATIVE = 1  # the command ran and the answer is "no": states differ, a check failed
EXIT_USAGE = 2  # a bad flag or argument (click's own code for usage errors)
EXIT_NOT_FOUND = 3
EXIT_CONFLICT = 4  # a conflict: the name exists already (pick another), or a concurrent writer won (re-read and decide)
EXIT_DATA = 5  # stored or received data is damaged or in a format this build does not read
EXIT_DENIED = 6  # no valid credentials, or not allowed
EXIT_UNAVAILABLE = 69  # sysexits EX_UNAVAILABLE: the store, the pool or the address is unusable now; retrying may help
EXIT_INTERNAL = 70  # sysexits EX_SOFTWARE: a bug; the message names the exception
EXIT_IO = 74  # sysexits EX_IOERR: a local file could not be read or written
EXIT_INTERRUPTED = 130  # Ctrl-C, as a shell reports SIGINT

# Looked up along the exception's MRO (snapshot.errors.lookup_by_class), like the gRPC and HTTP tables of the pool.
EXIT_CODE_BY_ERROR: dict[type[BaseException], int] = {
    click.UsageError: EXIT_USAGE,
    click.BadParameter: EXIT_USAGE,
    InvalidArgumentError: EXIT_USAGE,
    LimitExceededError: EXIT_USAGE,
    NotFoundError: EXIT_NOT_FOUND,
    FileNotFoundError: EXIT_NOT_FOUND,
    ConflictError: EXIT_CONFLICT,
    FencedError: EXIT_CONFLICT,
    CorruptDataError: EXIT_DATA,
    UnsupportedFormatVersionError: EXIT_DATA,
    PermissionDeniedError: EXIT_DENIED,
    UnauthenticatedError: EXIT_DENIED,
    PermissionError: EXIT_DENIED,
    ResourceExhaustedError: EXIT_UNAVAILABLE,  # a server limit; LimitExceededError (the request itself) is listed above
    UnavailableError: EXIT_UNAVAILABLE,
    OSError: EXIT_IO,
    ClinkError: EXIT_INTERNAL,
}

EXIT_MEANINGS: tuple[tuple[int, str], ...] = (
    (EXIT_OK, "success"),
    (EXIT_NEGATIVE, "a negative answer (states differ, a check failed)"),
    (EXIT_USAGE, "bad usage or argument"),
    (EXIT_NOT_FOUND, "not found"),
    (EXIT_CONFLICT, "a conflict: it exists already, or a concurrent change won"),
    (EXIT_DATA, "damaged data"),
    (EXIT_DENIED, "denied"),
    (EXIT_UNAVAILABLE, "store or pool unavailable (retry)"),
    (EXIT_INTERNAL, "internal error"),
    (EXIT_IO, "local I/O error"),
    (EXIT_INTERRUPTED, "interrupted"),
)

EXIT_HELP = "\b\nExit codes: " + ", ".join(f"{code} {meaning}" for code, meaning in EXIT_MEANINGS) + "; every error is one line on stderr."


def exit_code_for(exc: BaseException) -> int:
    """The exit code of an error: the table entry of its most specific class, EXIT_INTERNAL when none is listed."""
    return lookup_by_class(EXIT_CODE_BY_ERROR, exc, EXIT_INTERNAL)


# --- environment: the same variables in both commands ------------------------------------------------------

ENV_S3_ENDPOINT = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
ENV_S3_REGION = ("AWS_REGION", "AWS_DEFAULT_REGION")
ENV_POOL_STORE = "CLINK_POOL_STORE"


def store_config(endpoint_url: str | None, region: str | None):
    """The StoreConfig both commands open stores with; credentials from the AWS variables, else boto3's default chain."""
    from store.objects import StoreConfig

    return StoreConfig(
        endpoint_url=endpoint_url or None,
        region=region or None,
        access_key_id=os.environ.get("AWS_ACCESS_KEY_ID") or None,
        secret_access_key=os.environ.get("AWS_SECRET_ACCESS_KEY") or None,
    )


# --- durations ---------------------------------------------------------------------------------------------


class Duration(click.ParamType):
    """A click type for durations: a number of seconds, or with a unit (90s, 15m, 2h, 7d)."""

    name = "duration"

    def __init__(self, positive: bool = False) -> None:
        self.positive = positive

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:  # noqa: D102
        if isinstance(value, (int, float)):
            seconds = float(value)
        else:
            try:
                seconds = parse_duration(value)
            except InvalidArgumentError as exc:
                self.fail(str(exc), param, ctx)
        if self.positive and seconds <= 0:
            self.fail(f"{value!r} must be more than 0 seconds", param, ctx)
        return seconds


DURATION = Duration()
POSITIVE_DURATION = Duration(positive=True)

# Old spellings still accepted, with a note on stderr; the new ones say the unit in the value (2h), not in the name.
RENAMED_OPTIONS: dict[str, str] = {
    "--gc-min-age-s": "--gc-min-age",
    "--call-idle-s": "--call-idle",
    "--call-max-s": "--call-max",
    "--max-rows": "--limit",
}


def renamed(args: Sequence[str], prog: str) -> list[str]:
    """``args`` with old option spellings replaced by the current ones (each noted once on stderr)."""
    out: list[str] = []
    for arg in args:
        if arg == "--":
            out.extend(args[len(out) :])
            break
        name, eq, value = arg.partition("=")
        new = RENAMED_OPTIONS.get(name)
        if new is not None:
            click.echo(f"{prog}: note: {name} is now {new}", err=True)
            arg = new + eq + value
        out.append(arg)
    return out


# --- options taken before or after the subcommand ------------------------------------------------------------

_SHARED_KEY = "clink.cli.shared"
_RANK = {ParameterSource.COMMANDLINE: 3, ParameterSource.ENVIRONMENT: 2, ParameterSource.DEFAULT_MAP: 1, ParameterSource.DEFAULT: 0}


def _remember(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """Keep the value given with the most authority: the command line (the later place wins), then the environment."""
    source = ctx.get_parameter_source(param.name or "")
    rank = _RANK.get(source, 0) if source is not None else 0
    chosen = ctx.meta.setdefault(_SHARED_KEY, {})
    held = chosen.get(param.name)
    if held is None or rank >= held[0]:
        chosen[param.name] = (rank, value)
    return value


def shared_option(*decls: str, **attrs: Any) -> Callable[[Callable], Callable]:
    """An option a group and its subcommands both take (`clink --s3-region R state-cat` or `clink state-cat --s3-region R`).

    Its value is read with shared_value(ctx, name), not passed to the command function.
    """
    return click.option(*decls, expose_value=False, callback=_remember, is_eager=False, **attrs)


def shared_value(ctx: click.Context, name: str, default: Any = None) -> Any:
    """The value of a shared option wherever it was given; ``default`` when nowhere."""
    held = ctx.meta.get(_SHARED_KEY, {}).get(name)
    return default if held is None or held[1] is None else held[1]


def apply(decorators: Sequence[Callable[[Callable], Callable]]) -> Callable[[Callable], Callable]:
    """One decorator applying ``decorators`` in order (the first is the first option in --help)."""

    def decorate(fn: Callable) -> Callable:
        for decorator in reversed(decorators):
            fn = decorator(fn)
        return fn

    return decorate


class EndpointUrl(click.ParamType):
    """A click type for an S3 endpoint: http:// or https://, a host, a port (store.uris.parse_endpoint_url); '' means none."""

    name = "url"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str | None:  # noqa: D102
        if value is None or value == "":
            return None
        from store.uris import parse_endpoint_url

        try:
            return parse_endpoint_url(value, what="")
        except InvalidArgumentError as exc:
            self.fail(str(exc).strip(), param, ctx)


S3_OPTIONS = (
    shared_option(
        "--s3-endpoint-url",
        envvar=list(ENV_S3_ENDPOINT),
        type=EndpointUrl(),
        metavar="URL",
        help="S3 endpoint for s3:// stores (MinIO, SeaweedFS, moto). Env: AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL. Default: AWS.",
    ),
    shared_option("--s3-region", envvar=list(ENV_S3_REGION), metavar="REGION", help="S3 region. Env: AWS_REGION, AWS_DEFAULT_REGION."),
)

OUTPUT_OPTION = shared_option(
    "--output",
    "-o",
    type=click.Choice(["text", "json"]),
    default=None,
    help="text for people (default), json for scripts: one JSON document on stdout, and errors as JSON on stderr.",
)


# --- output ----------------------------------------------------------------------------------------------------


def json_default(value: object) -> object:
    """JSON for what json.dumps does not know: bytes as 0x-hex, decimals as numbers, times as ISO 8601."""
    from decimal import Decimal

    if isinstance(value, (bytes, bytearray, memoryview)):
        return "0x" + bytes(value).hex()
    if isinstance(value, Decimal):
        # DuckDB sums of BIGINT are HUGEINT, which Arrow hands over as decimal128(38, 0)
        return int(value) if value == value.to_integral_value() else float(value)
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return str(value)


def dumps(doc: object, *, one_line: bool = False) -> str:
    """The JSON style of both commands: keys in the order the document gives them, UTF-8, indented unless one line."""
    return json.dumps(doc, indent=None if one_line else 2, default=json_default, ensure_ascii=False)


@dataclass
class Output:
    """Text for people or JSON for scripts (as pyiceberg's Output): every command prints its result and errors through it."""

    prog: str
    format: str = "text"

    @property
    def is_json(self) -> bool:
        """Whether results and errors are JSON."""
        return self.format == "json"

    def result(self, doc: Mapping[str, Any], text: str | Callable[[], None]) -> None:
        """A command's result: ``doc`` as JSON on stdout, or ``text`` (a string, or a function printing it)."""
        if self.is_json:
            click.echo(dumps(doc))
        elif callable(text):
            text()
        else:
            click.echo(text)

    def event(self, doc: Mapping[str, Any], text: str) -> None:
        """One line announcing something (a server's ready line): one JSON object per line, or ``text``."""
        click.echo(dumps(doc, one_line=True) if self.is_json else text)

    def note(self, text: str, **facts: Any) -> None:
        """One line on stderr that is no error (stdout unchanged): ``prog: note: ...``, or a JSON object with the facts."""
        if self.is_json:
            click.echo(dumps({"note": one_line(text), **facts}, one_line=True), err=True)
        else:
            click.echo(f"{self.prog}: note: {one_line(text)}", err=True)

    def error(self, exc: BaseException, code: int, message: str | None = None) -> None:
        """One line on stderr naming what is wrong: ``prog: error: ...``, or a JSON object with the same facts."""
        text = one_line(message if message is not None else str(exc) or type(exc).__name__)
        if self.is_json:
            doc = {"error": type(exc).__name__, "message": text, "exit_code": code}
            path = getattr(exc, "path", None)
            if isinstance(path, str):
                doc["path"] = path
            operators = getattr(exc, "operators", None)  # NonRestoredStateError: the undeclared operators, for a script
            if isinstance(operators, dict):
                doc["operators"] = [{"op_id": op, "op_id_hex": f"0x{op:016x}", "uid": uid} for op, uid in sorted(operators.items())]
            click.echo(dumps(doc, one_line=True), err=True)
        else:
            click.echo(f"{self.prog}: error: {text}", err=True)


def iso_utc(ms: int) -> str:
    """Epoch milliseconds as an ISO 8601 UTC time to the second: 2026-12-01T09:30:00Z."""
    from datetime import datetime, timezone

    return datetime.fromtimestamp(ms / 1000, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def one_line(text: str) -> str:
    """``text`` with every run of whitespace (newlines too) as one space."""
    return " ".join(str(text).split())


def output_of(ctx: click.Context) -> Output:
    """The Output the --output option chose for this invocation."""
    root = ctx.find_root()
    return Output(root.info_name or "clink", shared_value(ctx, "output", "text"))


# --- progress ----------------------------------------------------------------------------------------------------


@contextmanager
def progress(enabled: bool | None) -> Iterator[Callable[..., Callable[..., None]]]:
    """Rich progress bars on stderr; yields ``step(description, total=None) -> advance(amount=1, total=None)``.

    ``enabled`` None draws only when stderr is a terminal; True draws into a pipe too (a log, a CI console).
    """
    from rich.console import Console
    from rich.progress import BarColumn, Progress, SpinnerColumn, TaskProgressColumn, TextColumn, TimeElapsedColumn

    console = Console(file=sys.stderr, highlight=False, force_terminal=True if enabled else None)
    show = console.is_terminal if enabled is None else enabled
    bars = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not show,
    )
    with bars:

        def step(description: str, total: float | None = None) -> Callable[..., None]:
            task = bars.add_task(description, total=total)

            def advance(amount: float = 1.0, total: float | None = None) -> None:
                bars.update(task, advance=amount, total=total)

            return advance

        yield step


@contextmanager
def progress_callback(label: str, enabled: bool | None) -> Iterator[Callable[[int, int], None]]:
    """A ``(done, total)`` callback drawing one bar (for library calls that report their own counts)."""
    with progress(enabled) as step:
        advance = step(label)
        seen = {"done": 0}

        def report(done: int, total: int) -> None:
            advance(done - seen["done"], total=total)
            seen["done"] = done

        yield report


# --- the group: one error handler, exit codes from the table ------------------------------------------------------


class CommandLine(click.Group):
    """A click group whose every outcome is an exit code from the table and every error one line on stderr.

    Subcommands return an int (their exit code) or None (success). ``command_modules`` name modules whose COMMANDS are
    added on the first lookup, so ``--help`` stays fast.
    """

    command_modules: tuple[str, ...] = ()
    _loaded = False
    _last_ctx: click.Context | None  # the context of the last invocation (set by make_context), for the error handler

    def _load_commands(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        import importlib

        for name in self.command_modules:
            for command in getattr(importlib.import_module(name), "COMMANDS", ()):
                self.add_command(command)

    def list_commands(self, ctx: click.Context) -> list[str]:  # noqa: D102
        self._load_commands()
        return super().list_commands(ctx)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:  # noqa: D102
        self._load_commands()
        return super().get_command(ctx, cmd_name)

    def explain(self, exc: ClinkError) -> str | None:
        """The error line for ``exc`` when this command line knows more than the error says (None: the error's own text)."""
        return None

    def make_context(self, info_name, args, parent=None, **extra):  # noqa: D102
        ctx = super().make_context(info_name, args, parent=parent, **extra)
        self._last_ctx = ctx
        return ctx

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):  # noqa: D102
        prog = prog_name or self.name or "clink"
        argv = renamed(list(sys.argv[1:] if args is None else args), prog)
        if not standalone_mode:
            return super().main(argv, prog_name, complete_var, standalone_mode=False, **extra)
        self._last_ctx = None
        code = run_handled(prog, lambda: super(CommandLine, self).main(argv, prog, complete_var, standalone_mode=False, **extra), self)
        sys.exit(code)


def run_handled(prog: str, invoke: Callable[[], object], group: CommandLine | None = None) -> int:
    """Invoke a command line and map every outcome to an exit code; an error is one line on stderr, never a traceback."""

    def output() -> Output:
        ctx = getattr(group, "_last_ctx", None)
        return output_of(ctx) if ctx is not None else Output(prog)

    try:
        rv = invoke()
        return rv if isinstance(rv, int) else EXIT_OK
    except click.exceptions.NoArgsIsHelpError as exc:
        click.echo(exc.ctx.get_help() if exc.ctx is not None else "", file=sys.stdout)
        return EXIT_OK
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.UsageError as exc:
        where = exc.ctx.command_path if exc.ctx is not None else prog
        output().error(exc, EXIT_USAGE, f"{exc.format_message()} (see '{where} --help')")
        return EXIT_USAGE
    except click.ClickException as exc:
        output().error(exc, EXIT_USAGE, exc.format_message())
        return EXIT_USAGE
    except (click.Abort, KeyboardInterrupt) as exc:
        click.echo(f"{prog}: interrupted", err=True)
        del exc
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # the reader went away (clink ... | head): not an error worth a message
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115
        return EXIT_OK
    except ClinkError as exc:
        code = exit_code_for(exc)
        output().error(exc, code, group.explain(exc) if group is not None else None)
        return code
    except OSError as exc:
        code = exit_code_for(exc)
        where = f"{exc.filename}: " if getattr(exc, "filename", None) else ""
        output().error(exc, code, f"{where}{exc.strerror or exc}")
        return code
    except Exception as exc:  # noqa: BLE001 - the last line of defence: one line, never a traceback
        output().error(exc, EXIT_INTERNAL, f"internal error: {type(exc).__name__}: {exc}")
        return EXIT_INTERNAL
