"""Building the model's frozen dataclasses from values decode has already checked, without __init__.

A frozen dataclass's __init__ sets each field with its own object.__setattr__ call: for the ~20 objects a rank's
replies make (its sockets, threads, kernel waits, counters: 100k ranks a pass at 12,500 nodes, issue 27) that
was a large share of decoding. A Builder copies the class's defaults and the given fields into a new instance's
attributes at once, then runs __post_init__ as __init__ would. The fields are checked against the class's (a
misspelt name raises, as __init__ would); their values are the caller's to check, as every reader in
app/decode does as it takes them.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Generic, Optional, Type, TypeVar

T = TypeVar("T")


class Builder(Generic[T]):
    __slots__ = ("cls", "defaults", "names", "order", "post")

    def __init__(self, cls: Type[T], **required: Any) -> None:
        """`required`: values for the fields without a default (any: only the others' defaults are kept)."""
        self.cls = cls
        self.order = tuple(f.name for f in dataclasses.fields(cls))  # type: ignore[arg-type]
        self.names = frozenset(self.order)
        self.defaults = {k: v for k, v in cls(**required).__dict__.items() if k in self.names and k not in required}
        self.post: Optional[Callable[[Any], None]] = getattr(cls, "__post_init__", None)

    def __call__(self, fields: Dict[str, Any], base: Optional[Dict[str, Any]] = None) -> T:
        """cls(**fields); with base (another instance's __dict__), dataclasses.replace(that instance, **fields)."""
        if not fields.keys() <= self.names:
            raise TypeError(f"{self.cls.__name__} has no field(s) {sorted(fields.keys() - self.names)}")
        new = object.__new__(self.cls)
        attrs = new.__dict__
        rest = self.defaults if base is None else base
        try:
            # one at a time, in the fields' order, as __init__ sets them: the instances keep sharing their
            # class's key table (dict.update into the empty __dict__ made each its own: 4x the memory)
            for name in self.order:
                attrs[name] = fields[name] if name in fields else rest[name]
        except KeyError as exc:
            raise TypeError(f"{self.cls.__name__}: missing field {exc}") from None
        if self.post is not None:
            self.post(new)
        return new
