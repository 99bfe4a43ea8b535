"""What every command shares: the typer app, the consoles, and the one-line error exit."""

from __future__ import annotations

import functools
import inspect
import json
import os
import sys
import textwrap
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Annotated, Any, NoReturn, TypeVar, cast

try:
    import typer
    from rich.console import Console
except ImportError:  # pragma: no cover - only without the cli extra
    sys.stderr.write("modeldrop's command line needs its extra: pip install 'modeldrop[cli,local]'\n")
    raise SystemExit(2) from None

from modeldrop.contracts.errors import ModeldropError


def _usage_name(self: Any) -> str:
    """An argument in a usage line as POSIX and click write it (`SOURCE`, `[DEST]`, `ARTIFACT...`):
    typer 0.29 writes a required one in braces (`{source}`), which reads as a set or a template."""
    name = str(self.display_name_raw).upper()
    if self.nargs != 1 and not name.endswith("..."):
        name += "..."
    return name if self.required else f"[{name}]"


typer.core.TyperArgument._usage_display_name = _usage_name  # type: ignore[method-assign]

app = typer.Typer(
    add_completion=False,
    # Plain help: the rich panels cut long option names (`--gpu-memory-uti…`) at 80 columns.
    rich_markup_mode=None,
    no_args_is_help=True,
    help="Ship a fine-tuned LLM to SageMaker, or leave nothing behind.",
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        from modeldrop import __version__

        print(f"modeldrop {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="print the version"),
) -> None:
    """Ship a fine-tuned LLM to SageMaker, or leave nothing behind."""


# Piped output gets room for the tables instead of rich's 80-column default.
# Piped output gets COLUMNS (or 80), as a terminal would: nothing a user copies is cut at any width.
# NO_COLOR (no-color.org): rich drops colours for it but still bolds and highlights numbers; without a
# colour system it prints no escape sequence at all.
_PLAIN = {"color_system": None, "highlight": False} if os.environ.get("NO_COLOR") else {}
console = Console(soft_wrap=True, **_PLAIN)  # type: ignore[arg-type]
err = Console(stderr=True, soft_wrap=True, **_PLAIN)  # type: ignore[arg-type]


_json_errors = False


def json_mode(enabled: bool) -> None:
    """A command given --json reports its errors as one JSON object on stdout, too."""
    global _json_errors
    _json_errors = enabled


@contextmanager
def byte_progress(label: str) -> Iterator[Callable[[], None]]:
    """A bar with bytes, rate and ETA on stderr while long byte work reports progress; nothing when
    stderr is not a terminal or the command prints JSON (as pip and huggingface-cli do). Yields a
    function that takes the bar down early (before other output follows)."""
    if _json_errors or not err.is_terminal:
        yield lambda: None
        return
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    from modeldrop.contracts import progress

    columns = (TextColumn(label), BarColumn(), DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn())
    with Progress(*columns, console=err, transient=True) as bar:
        task = bar.add_task(label, total=None)

        def update(done: int, total: int | None) -> None:
            bar.update(task, completed=done, total=total)

        with progress.listening(update):
            yield bar.stop


def fail(message: str, hint: str | None = None, code: int = 2, error: str = "UsageError") -> NoReturn:
    from modeldrop.contracts.text import printable

    if _json_errors:
        print(json.dumps({"error": error, "message": printable(message), "hint": printable(hint) if hint else None}))
        raise typer.Exit(code)
    # Messages quote paths and names from the user's input: printed literally, never as markup.
    err.print(printable(f"error: {message}") + (f"\n  fix: {printable(hint)}" if hint else ""), markup=False)
    raise typer.Exit(code)


def check_region(region: str) -> None:
    """Exit 2 before any work on a region SageMaker has in no partition, with the close match."""
    from modeldrop.operate.aws_problems import region_problem

    if problem := region_problem(region):
        fail(problem[0], problem[1], error=problem[2])


# What each optional extra brings, by the modules a command imports from it.
EXTRA_MODULES = {"local": ("moto", "yaml", "jsonata")}


def need_extra(extra: str, command: str) -> None:
    """Exit 2 with one line naming the extra when COMMAND's optional dependencies are not installed."""
    import importlib.util

    missing = [m for m in EXTRA_MODULES[extra] if importlib.util.find_spec(m) is None]
    if missing:
        fail(
            f"{command} needs modeldrop's `{extra}` extra ({', '.join(missing)} not installed)",
            f'pip install "modeldrop[{extra}]" (from a clone: pip install ".[{extra}]")',
            error="ExtraMissing",
        )


@contextmanager
def aws_errors(domain_errors: bool = True) -> Iterator[None]:
    """What a user can get wrong about AWS becomes one line and exit 2, never a traceback.

    With domain_errors=False a command formats modeldrop's own errors itself (e.g. as JSON).
    """
    from botocore.exceptions import (
        BotoCoreError,
        ClientError,
        EndpointConnectionError,
        NoCredentialsError,
        NoRegionError,
    )

    try:
        yield
    except ModeldropError as exc:
        if not domain_errors:
            raise
        fail(exc.message, exc.hint, error=type(exc).__name__)
    except NoCredentialsError:
        fail(
            "no AWS credentials found",
            "configure them (aws configure, AWS_PROFILE, or an instance role)",
            error="NoCredentials",
        )
    except NoRegionError:
        fail("no AWS region configured", "pass --region or set AWS_REGION", error="NoRegion")
    except EndpointConnectionError as exc:
        from modeldrop.operate.aws_problems import connection_problem

        if problem := connection_problem():
            fail(problem[0], problem[1], error=problem[2])
        fail(f"cannot reach AWS: {exc}", "check the region name and the network", error="EndpointUnreachable")
    except ClientError as exc:
        from modeldrop.operate.aws_problems import client_error_problem

        detail = exc.response.get("Error", {})
        if problem := client_error_problem(dict(detail)):
            fail(problem[0], problem[1], error=problem[2])
        fail(
            f"AWS refused {exc.operation_name}: {detail.get('Code')}: {detail.get('Message')}",
            error=str(detail.get("Code") or "ClientError"),
        )
    except BotoCoreError as exc:
        fail(f"AWS SDK: {exc}", error=type(exc).__name__)


def session_for(region: str | None, profile: str | None = None) -> Any:
    import boto3
    from botocore.exceptions import ProfileNotFound

    from modeldrop.aws.clients import RETRIES

    # AWS_REGION is what other SDKs and Lambda read; botocore reads only AWS_DEFAULT_REGION.
    try:
        session = boto3.session.Session(
            profile_name=profile, region_name=region or os.environ.get("AWS_REGION") or None
        )
    except ProfileNotFound:
        fail(f"no AWS profile named {profile!r}", "see `aws configure list-profiles`", error="NoProfile")
    # Every client the commands make retries as the pipeline's do (a client's own config adds to it).
    session._session.set_default_client_config(RETRIES)
    if session.region_name is None:
        fail("no AWS region configured", "pass --region or set AWS_REGION", error="NoRegion")
    check_region(session.region_name)  # before any call: a region no SageMaker has is a typo, not the network
    return session


def instance_choice(text: str | None) -> dict[str, Any]:
    """--instance-type: one type, a comma list tried in order (capacity fallback), or 'auto'."""
    if not text:
        return {}
    from modeldrop.contracts.instance_types import instance_type_problem

    items = [t.strip() for t in text.split(",") if t.strip()]
    if items == ["auto"]:
        return {"instance_types": "auto"}
    for item in items:
        problem = instance_type_problem(item)
        if problem:
            fail(f"--instance-type {item}: {problem[0]}", problem[1])
    if len(items) == 1:
        return {"instance_type": items[0]}
    return {"instance_type": items[0], "instance_types": items}


def minutes(option: str, text: str | None) -> float | None:
    """'30m', '2h', '45' (minutes) -> minutes."""
    if text is None:
        return None
    import re

    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([mhd]?)\s*", text)
    if m is None:
        fail(f"{option} {text!r} is not a duration", "use e.g. 30m, 2h or 45 (minutes)")
    return float(m[1]) * {"": 1.0, "m": 1.0, "h": 60.0, "d": 1440.0}[m[2]]


def fields(rows: list[tuple[str, str]], pad: int | None = None) -> None:
    """KEY  VALUE lines, wrapped at the terminal's width (piped: COLUMNS, else 80) under the value's
    column; a word longer than that (an image URI, a console link) is printed whole and left to the
    terminal to wrap, so it can still be copied; a multi-line value (an env) is indented under its key."""
    from rich.markup import escape

    width = pad or max((len(k) for k, _ in rows), default=0)
    room = max(console.width - width - 2, 24)
    for key, value in rows:
        lines = [
            line
            for part in str(value).split("\n")
            for line in textwrap.wrap(part, room, break_long_words=False, break_on_hyphens=False) or [""]
        ] or [""]
        console.print(f"[bold]{escape(key):<{width}}[/]  {escape(lines[0])}", soft_wrap=True, highlight=False)
        for line in lines[1:]:
            console.print(" " * (width + 2) + escape(line), soft_wrap=True, highlight=False)


def pairs(option: str, items: list[str] | None) -> dict[str, str]:
    """Repeated KEY=VALUE options as a dict. A value is never repeated in an error (it may be a
    credential given by mistake); --env values are held to what a container env may carry."""
    from modeldrop.contracts.env_safety import env_problem

    out: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            fail(f"{option} takes KEY=VALUE; one of its values has no '=' (or no key)")
        if option == "--env" and (problem := env_problem(key, value)):
            fail(f"--env {problem}")
        out[key] = value
    return out


def checked_engine_env(engine: str, version: Any, passthrough: Mapping[str, str]) -> None:
    """Exit 2 naming the first raw engine key VERSION's engine would not take as it is (an option its
    parser lacks, an abbreviation, or one that loads code, files or bypasses the plan)."""
    from modeldrop.serving.engine_options import first_problem

    problem = first_problem(engine, passthrough, version)  # type: ignore[arg-type]
    if problem is not None:
        fail(f"--env {problem[0]}", problem[1], error="EngineKeyRefused")


# The options `plan`, `deploy` and `run-local` share, declared once.
InstanceTypesOpt = Annotated[
    str | None, typer.Option(help="a type, a comma list tried in order when one has no capacity, or 'auto'")
]
QuotaWaitOpt = Annotated[
    str | None, typer.Option(help="wait this long for a type at its endpoint quota, e.g. 30m (default: 0)")
]
MaxHourlyPriceOpt = Annotated[float | None, typer.Option(help="USD per instance-hour: dearer types are never tried")]
InstanceCountOpt = Annotated[
    int, typer.Option(min=1, help="instances behind the endpoint, each holding the whole model (default 1)")
]
MaxNumSeqsOpt = Annotated[int | None, typer.Option(min=1, help="concurrent sequences (the plan checks memory)")]
MaxModelLenOpt = Annotated[int | None, typer.Option(min=256, help="context length (the plan checks memory)")]
EnvOpt = Annotated[
    list[str] | None, typer.Option(help="raw engine key KEY=VALUE (the engine's own prefix only); repeatable")
]
ForceOpt = Annotated[bool, typer.Option(help="go ahead even when the memory plan predicts a CUDA OOM")]
SecretOpt = Annotated[list[str] | None, typer.Option(help="NAME=secretsmanager:<name>[#key] or ssm:<name>; repeatable")]
MaxTruncatedOpt = Annotated[int | None, typer.Option(min=0, help="eval cases that may be truncated")]
# Named engine settings, as `vllm serve` spells them; the plan checks each (raw --env keys it cannot).
GpuMemoryOpt = Annotated[
    float | None, typer.Option(help="fraction of each GPU's memory the engine may use: the plan's budget (0.90)")
]
TensorParallelOpt = Annotated[
    int | None, typer.Option(min=1, help="GPUs per replica; must divide the instance's GPU count (default: all)")
]
DtypeOpt = Annotated[str | None, typer.Option(help="auto | bfloat16 | float16 | float32: the plan sizes weights at it")]
QuantizationOpt = Annotated[str | None, typer.Option(help="quantization method, e.g. fp8, awq, gptq")]
MediaLimitOpt = Annotated[
    str | None, typer.Option(help='media items per prompt, e.g. image=2,video=0 or {"image":2} (multimodal only)')
]
SpeculativeModelOpt = Annotated[
    str | None, typer.Option(help="EAGLE3 draft head (a Hugging Face id or ./dir in the artifact): turns it on")
]
SpeculativeTokensOpt = Annotated[int | None, typer.Option(min=1, max=16, help="tokens the draft proposes (3)")]
ParallelDraftingOpt = Annotated[
    bool,
    typer.Option(help="P-EAGLE parallel drafting (needs a head trained for it; off by default)", show_default=False),
]

# The named engine-setting options, declared once for every command that plans (see engine_options).
ENGINE_OPTIONS: dict[str, tuple[Any, Any]] = {
    "gpu_memory_utilization": (GpuMemoryOpt, None),
    "tensor_parallel_size": (TensorParallelOpt, None),
    "dtype": (DtypeOpt, None),
    "quantization": (QuantizationOpt, None),
    "limit_mm_per_prompt": (MediaLimitOpt, None),
    "speculative_model": (SpeculativeModelOpt, None),
    "speculative_tokens": (SpeculativeTokensOpt, None),
    "parallel_drafting": (ParallelDraftingOpt, False),
}

Command = TypeVar("Command", bound=Callable[..., Any])


def engine_options(command: Command) -> Command:
    """Give COMMAND the named engine-setting options after its own; it receives them, as typed, in
    one `named_settings` parameter (for engine_settings / request_fields)."""
    own = inspect.signature(command, eval_str=True)
    params = [p for p in own.parameters.values() if p.name != "named_settings"]
    params += [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)
        for name, (annotation, default) in ENGINE_OPTIONS.items()
    ]

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> Any:
        named = {name: kwargs.pop(name) for name in ENGINE_OPTIONS}
        return command(*args, named_settings=named, **kwargs)

    # typer reads the signature and the type hints: both name the added options, none names `named_settings`.
    run.__signature__ = own.replace(parameters=params)  # type: ignore[attr-defined]
    run.__annotations__ = {p.name: p.annotation for p in params}
    return cast(Command, run)


# The EngineSettings fields whose option has the same name and type.
NAMED_SETTINGS = ("gpu_memory_utilization", "tensor_parallel_size", "dtype", "quantization")


def engine_settings(options: Mapping[str, Any]) -> dict[str, Any]:
    """The named engine options among a command's OPTIONS (its locals()) as EngineSettings fields,
    only those given, checked by its model."""
    from pydantic import ValidationError

    from modeldrop.contracts.errors import describe_validation
    from modeldrop.contracts.models import EngineSettings

    raw: dict[str, Any] = {name: options.get(name) for name in NAMED_SETTINGS}
    raw["limit_mm_per_prompt"] = _media(options.get("limit_mm_per_prompt"))
    speculative_model = options.get("speculative_model")
    speculative_tokens = options.get("speculative_tokens")
    parallel_drafting = bool(options.get("parallel_drafting"))
    if speculative_model is None and (speculative_tokens is not None or parallel_drafting):
        fail("--speculative-tokens and --parallel-drafting need --speculative-model (the EAGLE3 draft head)")
    if speculative_model is not None:
        raw["speculative"] = {"model": speculative_model, "parallel_drafting": parallel_drafting}
        if speculative_tokens is not None:
            raw["speculative"]["num_speculative_tokens"] = speculative_tokens
    given = {k: v for k, v in raw.items() if v is not None}
    try:
        EngineSettings.model_validate(given)
    except ValidationError as exc:
        fail(f"engine setting: {describe_validation(exc)}")
    return given


def _media(text: str | None) -> dict[str, int] | None:
    if text is None:
        return None
    if text.lstrip().startswith("{"):
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            fail(f"--limit-mm-per-prompt is not JSON: {exc}")
        if not isinstance(value, dict):
            fail('--limit-mm-per-prompt must be an object such as {"image": 2}')
        return value
    out: dict[str, int] = {}
    for item in text.split(","):
        kind, sep, count = item.partition("=")
        if not sep or not count.strip().isdigit():
            fail(f"--limit-mm-per-prompt {item!r} is not KIND=N", "e.g. image=2,video=0")
        out[kind.strip()] = int(count)
    return out


MaxErrorsOpt = Annotated[int | None, typer.Option(min=0, help="eval cases that may error")]


def request_fields(options: Mapping[str, Any]) -> dict[str, Any]:
    """The shared knobs among a command's OPTIONS (its locals(): the option names declared above) as
    DeploymentRequest fields, only those given (so `plan`'s fix reproduces)."""
    get = options.get
    max_num_seqs, max_model_len, env, secrets = get("max_num_seqs"), get("max_model_len"), get("env"), get("secret")
    max_truncated, max_errors, max_hourly_price = get("max_truncated"), get("max_errors"), get("max_hourly_price")
    instance_count, quota_wait = get("instance_count", 1), get("quota_wait")
    settings = engine_settings(options)
    out: dict[str, Any] = {}
    waited = minutes("--quota-wait", quota_wait)
    if waited is not None:
        out["quota_wait_minutes"] = waited
    if max_hourly_price is not None:
        out["max_hourly_price"] = max_hourly_price
    if instance_count != 1:
        out["instance_count"] = instance_count
    if settings:
        out["engine_settings"] = settings
    if max_num_seqs is not None:
        out["max_num_seqs"] = max_num_seqs
    if max_model_len is not None:
        out["max_model_len"] = max_model_len
    if env:
        out["engine_env"] = pairs("--env", env)
    if get("force"):
        out["force_plan"] = True
    if secrets:
        out["secrets"] = pairs("--secret", secrets)
    thresholds = {k: v for k, v in (("max_truncated", max_truncated), ("max_errors", max_errors)) if v is not None}
    if thresholds:
        out["eval_thresholds"] = thresholds
    return out
