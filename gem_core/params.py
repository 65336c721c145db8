"""Declared arguments: the types and ranges an env (or a vector env, a tool) accepts, checked in one place.

An env class declares its constructor's arguments once, as a ``params`` mapping of name to
:class:`Param`, and rules that tie several arguments together in a ``check_params`` classmethod::

    class GuessTheNumber(TextGame):
        params = {**TextGame.params, "min_number": Param(int, low=-10**9, high=10**9, none="drawn per episode")}

:func:`check_args` applies both; ``gem_core.make`` and ``make_vec`` call it in the caller's process
before anything is built (so a sync and an async vector env give the same message, before any worker
starts), and the games' constructors call it too. A bad value raises
:class:`~gem_core.errors.InvalidArgumentError` (a ``ValueError``; :class:`InvalidArgumentTypeError`,
also a ``TypeError``, for a value of the wrong type) whose one-line message names the argument, the
value and what is allowed::

    game:GuessTheNumber-v0-easy: max_turns='5' is not allowed: expected an integer in 1..100000, or None (the game's default)
"""

from __future__ import annotations

import functools
import inspect
import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gem_core.errors import InvalidArgumentError, InvalidArgumentTypeError
from gem_core.parsing import echo

#: The turn limit every game accepts: more turns than any episode needs, few enough to stay a number.
MAX_TURNS_LIMIT = 100_000


@dataclass(frozen=True)
class Param:
    """One argument's type and range.

    ``kind``: ``int``, ``float`` (ints accepted), ``bool`` or ``str``. ``low``/``high``: inclusive
    bounds (numbers). ``choices``: the only values allowed. ``none``: what ``None`` means, when
    ``None`` is allowed (``""``: not allowed). ``pair``: a ``(a, b)`` pair of such values (each may be
    ``None`` when ``none`` is set). ``finite``: floats must be finite. ``above``: an exclusive lower
    bound (``step_timeout`` > 0).
    """

    kind: type
    low: float | None = None
    high: float | None = None
    choices: tuple[Any, ...] | None = None
    none: str = ""
    pair: bool = False
    finite: bool = True
    above: float | None = None

    def allowed(self) -> str:
        """What is allowed, in words (``an integer in 1..100000, or None (drawn per episode)``)."""
        if self.choices is not None:
            text = "one of " + ", ".join(map(repr, self.choices))
        else:
            noun = {int: "an integer", float: "a number", bool: "True or False", str: "a string"}[self.kind]
            if self.low is not None and self.high is not None:
                text = f"{noun} in {_number(self.low)}..{_number(self.high)}"
            elif self.low is not None:
                text = f"{noun} >= {_number(self.low)}"
            elif self.above is not None:
                text = f"{noun} > {_number(self.above)}"
            elif self.high is not None:
                text = f"{noun} <= {_number(self.high)}"
            else:
                text = noun
        if self.pair:
            text = f"a pair of {text.replace('an integer', 'integers').replace('a number', 'numbers')}"
        return text + (f", or None ({self.none})" if self.none else "")

    def check(self, name: str, value: Any, where: str = "") -> Any:
        """``value`` if allowed, else :class:`InvalidArgumentError` naming ``where``, ``name``, the value and
        what is allowed. numpy scalars count as the Python ones."""
        if value is None:
            if self.none:
                return value
            self._fail(name, value, where, wrong_type=True)
        if self.pair:
            if not isinstance(value, (tuple, list)) or len(value) != 2:
                self._fail(name, value, where, wrong_type=True)
            for item in value:
                if item is not None or not self.none:
                    self._check_one(name, value, item, where)
            return value
        return self._check_one(name, value, value, where)

    def _check_one(self, name: str, whole: Any, value: Any, where: str) -> Any:
        kind = self.kind
        if kind is bool:
            ok_type = isinstance(value, (bool, _np_bool()))
        elif kind is int:
            ok_type = isinstance(value, numbers.Integral) and not isinstance(value, (bool, _np_bool()))
        elif kind is float:
            ok_type = isinstance(value, numbers.Real) and not isinstance(value, (bool, _np_bool()))
        else:
            ok_type = isinstance(value, kind)
        if not ok_type:
            self._fail(name, whole, where, wrong_type=True)
        if self.choices is not None and value not in self.choices:
            self._fail(name, whole, where)
        if kind in (int, float):
            if kind is float and self.finite and not math.isfinite(value):
                self._fail(name, whole, where)
            if (
                self.low is not None
                and not value >= self.low
                or self.high is not None
                and not value <= self.high
                or self.above is not None
                and not value > self.above
            ):
                self._fail(name, whole, where)
        return value

    def _fail(self, name: str, value: Any, where: str, *, wrong_type: bool = False) -> None:
        raise invalid(name, value, self.allowed(), where, wrong_type=wrong_type)


def invalid(name: str, value: Any, allowed: str, where: str = "", *, wrong_type: bool = False) -> InvalidArgumentError:
    """The error for ``name=value`` (the value's echo bounded) when ``allowed`` says what would do."""
    prefix = f"{where}: " if where else ""
    error = InvalidArgumentTypeError if wrong_type else InvalidArgumentError
    return error(f"{prefix}{name}={echo(value)} is not allowed: expected {allowed}", name=name, value=value, allowed=allowed)


def check_args(cls: Any, args: Mapping[str, Any], where: str = "") -> None:
    """Check ``args`` against ``cls.params`` (names it does not declare are not checked here), then
    ``cls.check_params(all_args)`` for the rules between arguments, where ``all_args`` is ``args`` over
    the constructor's defaults. ``where`` starts each message (an env id, a class name)."""
    declared: Mapping[str, Param] = getattr(cls, "params", None) or {}
    for name, value in args.items():
        param = declared.get(name)
        if param is not None:
            param.check(name, value, where)
    rules = getattr(cls, "check_params", None)
    if rules is not None:
        try:
            rules({**_defaults(cls), **args})
        except InvalidArgumentError as err:
            if where and not str(err).startswith(where):
                raise type(err)(f"{where}: {err}", name=err.name, value=err.value, allowed=err.allowed) from None
            raise


@functools.lru_cache(maxsize=None)
def _defaults(cls: Any) -> dict[str, Any]:
    """The constructor's keyword defaults of ``cls``."""
    try:
        parameters = inspect.signature(cls).parameters.values()
    except (TypeError, ValueError):  # no introspectable signature: no defaults to add
        return {}
    return {p.name: p.default for p in parameters if p.default is not inspect.Parameter.empty}


def _number(x: float) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def _np_bool() -> type:
    import numpy as np

    return np.bool_
