"""Old public names kept for a release after a rename (clients/CONTRACT.md,
"Renamed names")."""

from __future__ import annotations

import warnings
from typing import Any, TypeVar

T = TypeVar("T", bound=type)


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
