"""A chat template rendered as transformers renders it (`apply_chat_template`): jinja2's
ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks, loop controls, `raise_exception`,
`strftime_now` and a `tojson` that does not escape HTML — held to a budget no template file can raise.

The sandbox stops attribute tricks but not work: `range` is capped at 100,000, yet nested loops,
a string doubled in a loop or `'x'|center(10**9)` would keep the validate Lambda busy or out of
memory. Rendering is traced: past MAX_STEPS template lines, a call with an integer argument past
MAX_INT, or a join, `+`, `*` or `**` whose result would pass MAX_TEXT, it stops with RenderRefused.
"""

from __future__ import annotations

import json
import operator
import sys
from collections.abc import Callable
from datetime import datetime
from types import FrameType
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

MAX_STEPS = 2_000_000  # template lines run; a real template renders three turns in a few thousand
MAX_INT = 1_000_000  # an integer argument past any width, count or index a chat template uses
MAX_TEXT = 1 << 20  # characters in any one string the template builds


class RenderRefused(ValueError):
    """The template ran past what rendering a chat may take."""


def _size(value: Any) -> int:
    return len(value) if isinstance(value, str | list | tuple) else 0


class _Bounded(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset(["+", "*", "**"])

    def call_binop(self, context: Any, operator_name: str, left: Any, right: Any) -> Any:
        if operator_name == "**" and isinstance(right, int) and abs(right) > 64:
            raise RenderRefused(f"a power of {right}")
        if operator_name == "*":
            count = right if isinstance(right, int) else left if isinstance(left, int) else 1
            if max(_size(left), _size(right)) * abs(count) > MAX_TEXT:
                raise RenderRefused(f"a repetition past {MAX_TEXT:,} characters")
        if operator_name == "+" and _size(left) + _size(right) > MAX_TEXT:
            raise RenderRefused(f"a string past {MAX_TEXT:,} characters")
        ops: dict[str, Callable[[Any, Any], Any]] = {"+": operator.add, "*": operator.mul, "**": operator.pow}
        return ops[operator_name](left, right)


class _Generation(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (transformers' AssistantTracker): the body, as is."""

    tags = {"generation"}

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Callable[[], str]) -> str:
        return caller()


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None, sort_keys: bool = False
) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:
    """jinja's lipsum global (its parameter names), refused before it loops where its words (about 12
    characters each) would pass MAX_TEXT."""
    bounds = (n, min, max)
    if (
        not all(isinstance(v, int) and not isinstance(v, bool) for v in bounds)
        or n * (min if min > max else max) * 12 > MAX_TEXT
    ):
        raise RenderRefused(f"lipsum{bounds} past {MAX_TEXT:,} characters")
    return str(jinja2.utils.generate_lorem_ipsum(n=n, html=html, min=min, max=max))


def compile_template(source: str) -> jinja2.Template:
    """SOURCE compiled as transformers compiles it (a TemplateSyntaxError when it is not Jinja)."""
    env = _Bounded(trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["lipsum"] = _lipsum
    return env.from_string(source)


# Where a template's calls land in Python: its filters, the sandbox's call() (every method call,
# `'x'.ljust(n)` among them) and the runtime's joins. Other frames hold ids and hashes, not sizes.
_CHECKED = ("jinja2/filters.py", "jinja2/sandbox.py", "jinja2/runtime.py", "jinja2/utils.py")


class _Guard:
    def __init__(self) -> None:
        self.steps = 0

    def __call__(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event == "call":
            if frame.f_code.co_filename.endswith(_CHECKED):
                self._check_arguments(frame)
            return self._line if frame.f_code.co_filename == "<template>" else None
        return None

    def _line(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event == "line":
            self.steps += 1
            if self.steps > MAX_STEPS:
                raise RenderRefused(f"it runs past {MAX_STEPS:,} template steps")
        return self._line

    @staticmethod
    def _check_arguments(frame: FrameType) -> None:
        code = frame.f_code
        names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount + bool(code.co_flags & 0x04)]
        for name in names:
            value = frame.f_locals.get(name)
            items = value if isinstance(value, tuple) else (value,)
            for item in items:
                if isinstance(item, int) and not isinstance(item, bool) and abs(item) > MAX_INT:
                    raise RenderRefused(f"an argument of {str(item)[:30]}")
            if isinstance(value, tuple | list) and sum(len(v) for v in value if isinstance(v, str)) > MAX_TEXT:
                raise RenderRefused(f"a string past {MAX_TEXT:,} characters")


def render(template: jinja2.Template, **variables: Any) -> str:
    """TEMPLATE rendered with VARIABLES, within the budget (RenderRefused past it)."""
    previous = sys.gettrace()
    sys.settrace(_Guard())
    try:
        text = template.render(**variables)
    finally:
        sys.settrace(previous)
    if len(text) > MAX_TEXT:
        raise RenderRefused(f"it renders {len(text):,} characters")
    return text
