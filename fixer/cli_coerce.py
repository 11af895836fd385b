"""Light coercion of the command-line values, so a short run (a pre-commit hook answered from the
result cache) does not pay for Pydantic.

Recent typer releases coerce every non-flag option through a Pydantic ``TypeAdapter`` built on
first use: importing Pydantic and scanning its plugins costs about as much as starting nafix
(measured by ``scripts/bench.py --speed hook``). nafix's options are plain strings, numbers,
string lists and enums, which need none of it: :func:`install` gives each such parameter of a
click command built by typer a coercer of its own, with the same results and a one-sentence
error. A parameter of any other kind, or a typer without this hook (older releases convert with
click's own types), is left to typer.
"""

from __future__ import annotations

import enum
import math
import typing
from typing import Any


def _plain(annotation: Any) -> tuple[str, Any] | None:
    """("str"|"bool"|"int"|"float"|"enum"|"list", detail) for the annotations coerced here, else None."""
    if typing.get_origin(annotation) is typing.Union:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) != 1:
            return None
        annotation = args[0]
    if typing.get_origin(annotation) in (list, typing.List):
        (item,) = typing.get_args(annotation) or (str,)
        return ("list", None) if item is str else None
    if annotation is str:
        return "str", None
    if annotation is bool:
        return "bool", None
    if annotation is int:
        return "int", None
    if annotation is float:
        return "float", None
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return "enum", annotation
    return None


def _convert(kind: str, detail: Any, value: Any, info: Any) -> Any:
    """``value`` as the option's type, or ValueError with the sentence to show."""
    if kind == "str":
        if not isinstance(value, str):
            raise ValueError(f"{value!r} is not a string")
        return value
    if kind == "bool":
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in ("1", "true", "t", "yes", "y", "on"):
            return True
        if text in ("0", "false", "f", "no", "n", "off"):
            return False
        raise ValueError(f"{value!r} is not a boolean")
    if kind == "list":
        items = list(value) if isinstance(value, (list, tuple)) else [value]
        if not all(isinstance(v, str) for v in items):
            raise ValueError(f"{items!r} is not a list of strings")
        return items
    if kind == "enum":
        if isinstance(value, detail):
            return value
        try:
            return detail(value)
        except ValueError:
            choices = ", ".join(repr(m.value) for m in detail)
            raise ValueError(f"{value!r} is not one of {choices}") from None
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a number")
    try:
        number = (int if kind == "int" else float)(value.strip() if isinstance(value, str) else value)
    except (TypeError, ValueError):
        raise ValueError(f"{value!r} is not {'an integer' if kind == 'int' else 'a number'}") from None
    low, high = getattr(info, "min", None), getattr(info, "max", None)
    if getattr(info, "clamp", False):
        raise ValueError("clamped ranges are left to typer")  # never reached: install() skips them
    if low is not None and not (number >= low):
        raise ValueError(f"{value} is below the minimum {low}")
    if high is not None and not (number <= high):
        raise ValueError(f"{value} is above the maximum {high}")
    if kind == "float" and isinstance(number, float) and math.isnan(number) and (low is not None or high is not None):
        raise ValueError(f"{value} is not a number in range")
    return number


def install(command: Any) -> int:
    """Give the options and arguments of ``command`` (a click command or group built by typer, with
    its subcommands) the light coercer where their type allows; return how many got it."""
    try:
        from typer import _coercion
        from typer._click.exceptions import BadParameter
    except ImportError:  # a typer without runtime coercion: click's types convert, nothing to do
        return 0
    base = getattr(_coercion, "PassThroughRuntimeParam", None)
    if base is None:
        return 0

    class _Light(base):  # type: ignore[misc,valid-type]
        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            kind, detail = _plain(self.annotation)  # type: ignore[misc]
            try:
                return _convert(kind, detail, value, self.parameter_info)
            except ValueError as exc:
                raise BadParameter(str(exc), ctx=ctx, param=param) from None

    count = 0
    names = (getattr(command, "context_settings", None) or {}).get("help_option_names")
    stack = [command]
    while stack:
        cmd = stack.pop()
        stack.extend(getattr(cmd, "commands", {}).values())
        params = list(getattr(cmd, "params", ()))
        try:  # the help option, built and kept by the command on first use: build it now
            from typer._click.core import Context

            helper = cmd.get_help_option(Context(cmd, help_option_names=names))
            if helper is not None:
                params.append(helper)
        except Exception:  # noqa: BLE001 - a typer without it: its help option is typer's
            pass
        for p in params:
            desc = getattr(p, "type_descriptor", None)
            info = getattr(desc, "parameter_info", None)
            if desc is None or getattr(p, "_runtime_param", 1) is not None or getattr(desc, "file_annotation", None):
                continue
            if getattr(info, "parser", None) is not None or getattr(info, "click_type", None) is not None:
                continue
            if getattr(info, "clamp", False) or _plain(desc.annotation) is None:
                continue
            try:
                p._runtime_param = _Light(annotation=desc.annotation, parameter_info=info)
            except TypeError:  # a typer whose runtime params take other fields: leave it to typer
                return count
            count += 1
    return count
