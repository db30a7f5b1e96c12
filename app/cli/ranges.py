"""The ranges of the numeric flags that more than one command takes (`hangscope`, `hangscope watch`), stated in
--help: one Kind per flag (app.inputs.numbers), so a flag accepts the same numbers whichever command it is given
to. The commands' own flags keep their ranges beside them."""

from __future__ import annotations

from app.inputs import numbers

DUMP_TIMEOUT = numbers.seconds(0.1, 600)
PID = numbers.count(1, 4194304, "a process id")  # PID_MAX_LIMIT on 64-bit Linux
FANOUT = numbers.count(1, 4096)
CONNECT_TIMEOUT = numbers.seconds(0.1, 600)
MAX_HOSTS = numbers.count(1, 100000)
FPS = numbers.count(1, 120)
