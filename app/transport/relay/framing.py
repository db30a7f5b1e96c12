"""The relay's wire format (both directions, binary and length-prefixed: over SSH there is no srun line limit)
and the `-c` argument that runs the relay stage (stage.py) on a node.

relay -> login: `kind u8, child u16, length u32, data` (O stdout, E stderr, X exit status in decimal).
login -> relay: the worker payload once, then `kind u8, tlen u16, length u32, targets, data` (D bytes, E EOF,
K EOF then kill); `targets` is one child, `*` or ranges, as the srun transport writes them (mux.targets), so a
request every child shares goes down once.
"""

from __future__ import annotations

import base64
import struct
import zlib
from pathlib import Path
from typing import Iterator, Optional, Sequence

from app.transport.srun.mux import targets

UP = struct.Struct(">BHI")  # must match stage.py
DOWN = struct.Struct(">BHI")
MAX_CHILDREN = 0xFFFF
MAX_FRAME = 1 << 30  # no frame of ours is this large: a stream that says so is not ours
STAGE_SOURCE = Path(__file__).with_name("stage.py")

__all__ = ["UP", "DOWN", "down", "down_to", "UpReader", "relay_stage", "ssh_argv", "targets"]


class FramingError(Exception):
    """The relay's stream is not frames of ours."""


def down(field: bytes, kind: str, data: bytes = b"") -> bytes:
    """One login -> relay frame for the children named by `field` (b"3", b"*", b"0-4,7")."""
    return DOWN.pack(ord(kind), len(field), len(data)) + field + data


def down_to(children: Sequence[int], every: int, kind: str, data: bytes = b"") -> bytes:
    """A frame for these children (of `every` in all): one child by its number, all as `*`, else ranges."""
    field = b"%d" % children[0] if len(set(children)) == 1 else targets(children, every)
    return down(field, kind, data)


def up(kind: str, child: int, data: bytes = b"") -> bytes:
    """One relay -> login frame (what stage.py writes; for tests)."""
    return UP.pack(ord(kind), child, len(data)) + data


class UpReader:
    """Cuts the relay's stdout into (kind, child, data) frames, whatever the chunk boundaries."""

    def __init__(self) -> None:
        self.buf = bytearray()

    def feed(self, chunk: bytes) -> Iterator[tuple[str, int, bytes]]:
        self.buf += chunk
        pos = 0
        size = UP.size
        try:
            while len(self.buf) - pos >= size:
                kind, child, length = UP.unpack_from(self.buf, pos)
                if kind not in (0x4F, 0x45, 0x58) or length > MAX_FRAME:  # O E X
                    raise FramingError(f"not a relay frame: {bytes(self.buf[pos:pos + 16])!r}")
                if len(self.buf) - pos - size < length:
                    break
                data = bytes(self.buf[pos + size:pos + size + length])
                pos += size + length
                yield chr(kind), child, data
        finally:
            if pos:
                del self.buf[:pos]


def ssh_argv(connect_timeout: float) -> list[str]:
    """The node's own OpenSSH client, as the relay runs it to a child: never a prompt, a pty, an agent or X11
    forwarded; host keys checked as the node's ssh config says (never weakened)."""
    return ["ssh", "-T", "-x", "-a", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={max(1, int(connect_timeout))}"]


def relay_stage(size: int, local_argv: Sequence[str], remote_command: str,
                children: Sequence[Optional[tuple[str, Optional[int], Optional[str]]]], *,
                connect_timeout: float, grace: float, parallel: int, start_deadline: float,
                ssh: Optional[Sequence[str]] = None) -> str:
    """The `-c` argument that runs the relay on its node: `children[0]` is None (the relay node's own worker,
    run with local_argv), every other child (host, port, user) is reached with ssh + remote_command (`ssh`:
    another client's argv, for tests)."""
    if len(children) > MAX_CHILDREN:
        raise ValueError(f"a relay serves at most {MAX_CHILDREN} children")
    # ascii() of str, int, float, None and lists of them is a Python literal the node's interpreter reads back
    args = (int(size), [str(a) for a in local_argv], [str(a) for a in ssh] if ssh is not None else ssh_argv(connect_timeout), str(remote_command),
            [[str(c[0]), int(c[1]) if c[1] else None, str(c[2]) if c[2] else None] if c is not None else None
             for c in children], float(grace), int(parallel), float(start_deadline))
    call = "main(%s)\n" % ", ".join(ascii(a) for a in args)
    code = STAGE_SOURCE.read_text(encoding="ascii") + "\n" + call
    packed = base64.b64encode(zlib.compress(code.encode("ascii"), 9)).decode("ascii")
    return 'import base64,zlib;exec(zlib.decompress(base64.b64decode("%s")))' % packed
