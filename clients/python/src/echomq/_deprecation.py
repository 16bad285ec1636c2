"""Old public names kept for a release after a rename (clients/CONTRACT.md,
"Renamed names")."""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

T = TypeVar("T", bound=type)

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def warn(message: str) -> None:
    """`DeprecationWarning` pointing at the first caller outside this package
    (the asyncio consumer is called by `echomq.sync`'s too, so no fixed
    stacklevel points at the user's line)."""
    level = 2  # 1 is this function; 2 its caller, sys._getframe(1)
    frame = sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE):
        frame = frame.f_back  # type: ignore[assignment]
        level += 1
    warnings.warn(message, DeprecationWarning, stacklevel=level)


def renamed_class(new: T, old_name: str, new_name: str) -> T:
    """A subclass of `new` called by its old name: it is `new` in every way,
    but constructing it warns `DeprecationWarning` (once per call site, as
    Python shows them). Type checkers see a plain alias (`if TYPE_CHECKING:
    Old = New`)."""

    init: Any = getattr(new, "__init__")

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        warnings.warn(
            f"{old_name} is deprecated and goes away in the next release: use {new_name}, the same thing",
            DeprecationWarning,
            stacklevel=2,
        )
        init(self, *args, **kwargs)

    doc = f"Deprecated: the old name of `{new_name}`; constructing it warns."
    namespace = {"__init__": __init__, "__doc__": doc, "__module__": new.__module__}
    alias: T = type(new)(old_name.rsplit(".", 1)[-1], (new,), namespace)
    return alias


def renamed_attributes(module: str, renamed: Mapping[str, tuple[str, Callable[[], object]]]) -> Callable[[str], object]:
    """A module `__getattr__` for names that were renamed: `renamed` maps an
    old name to its new one (as a user imports it) and a function that
    returns the object. Reading
    an old name (`from echomq import Appended`, `echomq.Appended`) warns
    `DeprecationWarning` and returns the new object itself."""

    def __getattr__(name: str) -> object:
        if name in renamed:
            new_name, get = renamed[name]
            warnings.warn(
                f"{module}.{name} is deprecated and goes away in the next release: use {new_name}, the same thing",
                DeprecationWarning,
                stacklevel=2,
            )
            return get()
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__
