"""Building the model's frozen dataclasses from values decode has already checked, without their __init__.

A frozen dataclass's __init__ sets each field with its own object.__setattr__ call: for the ~20 objects a rank's
replies make (its sockets, threads, kernel waits, counters: 100k ranks a pass at 12,500 nodes, issue 27) that
was a large share of decoding. A Builder is a function generated per class, like dataclasses' own __init__,
with the same keyword parameters and defaults (a misspelt or missing name raises TypeError as __init__ would),
that stores the values into the new instance's attributes directly, in the fields' order (so every instance
shares its class's key table, as __init__'s do; a class with slots, through each field's slot descriptor), then
runs __post_init__. The values are the caller's to check, as every reader in app/decode does as it takes them.
`replace` is dataclasses.replace the same way.

What it costs in memory: reading an instance's __dict__ gives it a dict object of its own (CPython 3.11 keeps
the values of an instance that __init__ built inline, without one): ~64 bytes more an instance (a frame ~220
bytes against ~160). The model's most numerous classes (RankSnapshot, Frame) have slots on Python >= 3.10,
where no dict exists (~110 bytes a frame; a slot descriptor's store is slower: 0.83 against 0.60 us a frame).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Generic, Type, TypeVar

T = TypeVar("T")


class Builder(Generic[T]):
    __slots__ = ("cls", "make", "replace")

    def __init__(self, cls: Type[T]) -> None:
        self.cls = cls
        fields = [f for f in dataclasses.fields(cls) if f.init]  # type: ignore[arg-type]
        names = [f.name for f in fields]
        if any(not n.isidentifier() for n in names) or len(fields) != len(dataclasses.fields(cls)):  # type: ignore[arg-type]
            raise TypeError(f"{cls.__name__}: only plain fields can be built")
        env: Dict[str, Any] = {"_new": object.__new__, "_cls": cls, "_post": getattr(cls, "__post_init__", None)}
        params = []
        for f in fields:
            if f.default is not dataclasses.MISSING:
                env["_d_" + f.name] = f.default
                params.append(f"{f.name}=_d_{f.name}")
            elif f.default_factory is not dataclasses.MISSING:
                raise TypeError(f"{cls.__name__}.{f.name}: a default factory cannot be built")
            else:
                params.append(f.name)
        post = "    _post(self)\n" if env["_post"] is not None else ""
        if "__slots__" in cls.__dict__:  # dataclass(slots=True): each field's slot set through its descriptor
            env.update({f"_s_{n}": cls.__dict__[n].__set__ for n in names})
            store = "".join(f"    _s_{n}(self, {n})\n" for n in names)
            taken = "".join(f"    _s_{n}(self, c.pop({n!r}) if {n!r} in c else old.{n})\n" for n in names)
            head, old_head = "    self = _new(_cls)\n", "    self = _new(_cls)\n"
        else:
            store = "".join(f"    a[{n!r}] = {n}\n" for n in names)
            taken = "".join(f"    a[{n!r}] = c.pop({n!r}) if {n!r} in c else o[{n!r}]\n" for n in names)
            head = "    self = _new(_cls)\n    a = self.__dict__\n"
            old_head = "    o = old.__dict__\n    self = _new(_cls)\n    a = self.__dict__\n"
        src = (f"def make({', '.join(['*'] + params)}):\n{head}{store}{post}"
               f"    return self\n"
               f"def replace(old, **c):\n{old_head}{taken}"
               f"    if c:\n        raise TypeError(f'{cls.__name__} has no field(s) {{sorted(c)}}')\n{post}"
               f"    return self\n")
        exec(src, env)  # generated from the class's own field names, as dataclasses writes __init__
        self.make: Callable[..., T] = env["make"]
        self.replace: Callable[..., T] = env["replace"]
