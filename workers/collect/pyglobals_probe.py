"""Module globals of a running CPython, read from its memory: the object layouts, learnt by the same interpreter
build on itself, and the reader that follows them (used by workers/collect/pyglobals.py).

py-spy's --locals shows nothing for a `<module>` frame: a script's top-level loop keeps its counters in the
`__main__` module's dict. Reading that dict from outside means following CPython's structs (_PyRuntime, the
interpreter state, dicts, str and int objects), whose layouts differ between versions and builds. Nothing here
is assumed: `calibrate()` runs inside the target's own interpreter binary (`<exe> -I -S -c <this source>`,
printing one JSON object), finds where _PyRuntime and the type objects lie relative to the file that holds them,
and tries the known layouts below on its OWN objects through /proc/self/mem, keeping only those that read its
own values back; it then reads its own `__main__` globals through the whole chain the worker will follow in a
target. When no layout passes, it says so: never a guess.

Known layouts (64-bit, little-endian, the default build, not free-threaded):
- dict keys, 3.8-3.10: dk_refcnt, dk_size, dk_lookup, dk_usable, dk_nentries, indices (1/2/4/8 bytes each by
  dk_size), entries of (hash, key, value); 3.11+: dk_refcnt, dk_log2_size, dk_log2_index_bytes, dk_kind,
  dk_version, dk_usable, dk_nentries, indices (1 << dk_log2_index_bytes bytes), entries of (key, value) for
  str-only keys (dk_kind 1) or (hash, key, value). PyDictObject: header, ma_used, a version tag, ma_keys,
  ma_values (a split table is not read: module dicts are combined).
- str: a compact ASCII string's characters follow a 48-byte header up to 3.11 (it holds wstr), 40 bytes from 3.12.
- int: ob_size (sign and digit count) up to 3.11, lv_tag (digit count << 3 | sign) from 3.12; 30-bit digits
  (sys.int_info says which).
The interpreter state and the module object are not described at all: the offsets of `interpreters.head`
in _PyRuntime, of the modules dict in the interpreter and of md_dict in a module are found by searching the
probe's own structs for pointers it knows (PyInterpreterState_Main(), id(sys.modules), id(module.__dict__)).

The reader (`Reader`) never trusts what it reads: every read is bounded (a byte budget per target), every
pointer's object type is checked against the target's own type objects before it is followed, only exact
compact-ASCII str keys are compared, and only ints and bools come back as values (decimal; at most
MAX_INT_DIGITS digits): any other object is reported by its type's name alone, so a string's contents (a
token, a path) never leave the process. A dict or a value that changes while it is read (the target runs on)
is "changed", never a mixture. Reading /proc/PID/mem needs the same access as ptrace but neither attaches
nor stops the process.

Python 3.8 syntax, standard library only (ctypes in calibrate() only): it runs under the job's interpreter.
"""

from __future__ import annotations

import os
import struct
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: see workers/__init__.py
    from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

MAX_NAMES = 32  # globals asked for per target
MAX_NAME_CHARS = 64
MAX_ENTRIES = 1 << 16  # dict entries walked
MAX_BYTES = 4 << 20  # bytes read from one target
MAX_INT_DIGITS = 3  # an int of more digits (90 bits) comes back as "<int>"
MAX_TYPE_NAME = 64
ATTEMPTS = 3  # reads of a dict or a value that the target changed meanwhile, before giving up on it
MAX_TASKS = 4096  # threads of a target whose states are read to judge a read that faulted the same way each time
MAX_MAPS_BYTES = 8 << 20
# how far the probe searches its own structs for the pointers it knows
RUNTIME_SCAN = 8192
INTERP_SCAN = 1 << 18
OBJECT_SCAN = 128
MAX_CANDIDATES = 8
MARKER = "_hangscope_probe_marker"  # globals the probe sets in its own __main__ to check the whole chain
MARKER_VALUE = 0x2F6E_3C5A_9B17_4D21  # three 30-bit digits
_Q = struct.Struct("<Q")
_q = struct.Struct("<q")
_I = struct.Struct("<I")
_QQ = struct.Struct("<QQ")
CHUNK = 128  # dict entries read at once
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.")


class Fault(Exception):
    """A read failed, or what was read is not what it must be: the value is not read."""


class Changed(Exception):
    """The target changed what was being read on every attempt."""


class Memory:
    """Bounded reads of a process's memory through /proc/PID/mem (pid "self": the probe's own)."""

    def __init__(self, pid: Any = "self", budget: int = MAX_BYTES) -> None:
        self.fd = os.open("/proc/%s/mem" % pid, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        self.pid = pid
        self.left = budget
        self.read_bytes = 0

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> "Memory":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def read(self, addr: int, size: int) -> bytes:
        if size < 0 or size > self.left:
            raise Fault("the read budget is spent")
        if addr < 4096 or addr + size > (1 << 63):
            raise Fault("bad address 0x%x" % addr)
        self.left -= size
        try:
            data = os.pread(self.fd, size, addr)
        except (OSError, OverflowError, ValueError) as exc:
            raise Fault("cannot read 0x%x: %s" % (addr, exc))
        self.read_bytes += len(data)
        if len(data) != size:
            raise Fault("short read at 0x%x" % addr)
        return data

    def ptr(self, addr: int) -> int:
        return _Q.unpack(self.read(addr, 8))[0]

    def runnable(self) -> bool:
        """Whether a thread of the target is runnable (R: on a CPU or preempted, waiting for one), so that it may
        be halfway through a write that a read saw the same way each time (a loaded node leaves a preempted
        writer off its CPU longer than the pauses between reads). A thread asleep in the kernel released the GIL
        at a point where the objects it wrote are whole. The reader's own memory ("self") has no such writer;
        threads past MAX_TASKS, or a task list that cannot be read, count as runnable."""
        if self.pid == "self":
            return False
        try:
            tasks = os.listdir("/proc/%s/task" % self.pid)
        except OSError:
            return True
        if len(tasks) > MAX_TASKS:
            return True
        for tid in tasks:
            try:
                with open("/proc/%s/task/%s/stat" % (self.pid, tid), "rb") as f:
                    stat = f.read(4096)
            except OSError:
                continue  # a thread that ended meanwhile
            if stat[stat.rfind(b")") + 2:][:1] == b"R":
                return True
        return False

    def upto(self, addr: int, size: int) -> bytes:
        """Up to size bytes from addr, fewer where a page cannot be read (a search of the probe's own structs)."""
        try:
            return self.read(addr, size)
        except Fault:
            pass
        parts, got = [], 0
        while got < size:
            step = min(size - got, 4096 - (addr + got) % 4096)
            try:
                parts.append(self.read(addr + got, step))
            except Fault:
                break
            got += step
        return b"".join(parts)


def parse_maps(text: str) -> List[Tuple[int, int, int, str, int, str]]:
    """/proc/PID/maps as (start, end, file offset, device, inode, path) rows."""
    rows = []
    for line in text.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 5 or "-" not in parts[0]:
            continue
        try:
            start, end = (int(x, 16) for x in parts[0].split("-", 1))
            rows.append((start, end, int(parts[2], 16), parts[3], int(parts[4]),
                         parts[5].strip() if len(parts) > 5 else ""))
        except ValueError:
            continue
    return rows


def read_maps(pid: Any, inodes: Optional[Sequence[int]] = None) -> List[Tuple[int, int, int, str, int, str]]:
    """pid's mappings; with inodes, only the lines that may map one of those files (the rest is not parsed)."""
    with open("/proc/%s/maps" % pid, "rb") as f:
        text = f.read(MAX_MAPS_BYTES).decode("utf-8", "replace")
    if inodes is not None:
        marks = [" %d " % i for i in inodes]
        text = "\n".join(line for line in text.splitlines() if any(m in line for m in marks))
    return parse_maps(text)


def locate(addr: int, maps: Sequence[Tuple[int, int, int, str, int, str]]) -> Optional[Dict[str, Any]]:
    """Which file holds a static address, and where relative to the file's lowest mapping (its load base): the
    same in every process that maps the file. An address in the zero-filled rest of a file's data (.bss) lies in
    the anonymous mapping right after the file's last one."""
    inside = [i for i, m in enumerate(maps) if m[0] <= addr < m[1]]
    if not inside:
        return None
    j = inside[0]
    while maps[j][4] == 0 and not maps[j][5] and j > 0 and maps[j - 1][1] == maps[j][0]:
        j -= 1
    dev, inode = maps[j][3], maps[j][4]
    if inode == 0:
        return None
    mine = [m for m in maps if m[3] == dev and m[4] == inode]
    base = min(mine)
    return {"dev": dev, "inode": inode, "path": maps[j][5][:4096], "base_offset": base[2], "delta": addr - base[0]}


def file_base(maps: Sequence[Tuple[int, int, int, str, int, str]], dev: str, inode: int) -> Optional[Tuple[int, int]]:
    """(the lowest address a file is mapped at, that mapping's file offset), or None when it is not mapped."""
    mine = [m for m in maps if m[3] == dev and m[4] == inode]
    if not mine:
        return None
    base = min(mine)
    return base[0], base[2]


class Layout:
    """Offsets and layout kinds; every field an int or a short string (what the probe prints)."""

    FIELDS = ("ob_type", "interp", "modules", "md_dict", "tp_name", "dict_used", "dict_kind", "str_header",
              "str_length", "str_state", "int_kind", "int_size", "int_digits", "digit_bits", "digit_size")

    def __init__(self, **kw: Any) -> None:
        self.ob_type = 8
        self.interp = 0  # offset of a pointer to the main interpreter in _PyRuntime
        self.modules = 0  # offset of the modules dict's pointer in the interpreter state
        self.md_dict = 16
        self.tp_name = 24
        self.dict_used = 16  # ma_used; ma_keys is 16 bytes on, ma_values 24
        self.dict_kind = "log2"  # "size" (3.8-3.10) or "log2" (3.11+)
        self.str_header = 48
        self.str_length = 16
        self.str_state = 32
        self.int_kind = "tag"  # "size" (ob_size, <= 3.11) or "tag" (lv_tag, 3.12+)
        self.int_size = 16  # where ob_size / lv_tag lies
        self.int_digits = 24
        self.digit_bits = 30
        self.digit_size = 4
        for k, v in kw.items():
            if k not in self.FIELDS:
                raise ValueError("unknown layout field %r" % k)
            setattr(self, k, v)

    def as_dict(self) -> Dict[str, Any]:
        return {k: getattr(self, k) for k in self.FIELDS}

    @classmethod
    def from_dict(cls, raw: Any) -> "Layout":
        """A layout from the probe's output, checked: offsets are small non-negative ints, kinds are known."""
        if not isinstance(raw, dict) or set(raw) != set(cls.FIELDS):
            raise ValueError("not a layout")
        for k, v in raw.items():
            if k in ("dict_kind", "int_kind"):
                if v not in (("size", "log2") if k == "dict_kind" else ("size", "tag")):
                    raise ValueError("unknown %s %r" % (k, v))
            elif isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < (1 << 20):
                raise ValueError("bad %s %r" % (k, v))
        if raw["digit_size"] not in (2, 4) or not 1 <= raw["digit_bits"] <= 8 * raw["digit_size"]:
            raise ValueError("bad digits")
        return cls(**raw)


class Reader:
    """Follows a layout through one process's memory. types: the addresses of that process's int, bool, dict,
    str and module type objects; runtime: its _PyRuntime."""

    def __init__(self, mem: Memory, layout: Layout, runtime: int, types: Dict[str, int]) -> None:
        self.mem, self.lay, self.runtime, self.types = mem, layout, runtime, types

    def type_of(self, obj: int) -> int:
        return self.mem.ptr(obj + self.lay.ob_type)

    def expect(self, obj: int, kind: str) -> int:
        if not obj or self.type_of(obj) != self.types[kind]:
            raise Fault("not a %s at 0x%x" % (kind, obj))
        return obj

    # -- dicts ------------------------------------------------------------------------------------------------

    def _table(self, d: int) -> Tuple[int, int, int, int, int, int]:
        """(ma_keys, entries address, entry size, key offset in an entry, number of entries, ma_used) of a
        combined dict; Fault for anything else, Changed for a table caught half built."""
        lay = self.lay
        used, _, keys, values = struct.unpack("<qQQQ", self.mem.read(d + lay.dict_used, 32))
        if values:
            raise Fault("a split dict")
        if not 0 <= used <= MAX_ENTRIES or not keys:
            raise Fault("a dict of %d entries" % used)
        if lay.dict_kind == "size":
            _, size, _, _, n = struct.unpack("<qqQqq", self.mem.read(keys, 40))
            if not 8 <= size <= (1 << 22) or size & (size - 1):
                raise Fault("dict keys of size %d" % size)
            width = 1 if size <= 0xFF else 2 if size <= 0xFFFF else 4
            start, esize, koff = keys + 40 + size * width, 24, 8
            capacity = size
        else:
            head = self.mem.read(keys, 32)
            log2, log2_index, kind = head[8], head[9], head[10]
            n = _q.unpack_from(head, 24)[0]
            if not 3 <= log2 <= 22 or not log2 <= log2_index <= log2 + 3 or kind not in (0, 1):
                raise Fault("dict keys of kind %d, log2 size %d" % (kind, log2))
            start, esize, koff = keys + 32 + (1 << log2_index), (16 if kind == 1 else 24), (0 if kind == 1 else 8)
            capacity = 1 << log2
        if not 0 <= n <= min(capacity, MAX_ENTRIES):
            raise Fault("a dict of %d entries in %d slots" % (n, capacity))
        if used > n:  # a resize publishes the new table before it copies the entries into it
            raise Changed("a dict caught while it was being rebuilt")
        return keys, start, esize, koff, n, used

    def items(self, d: int, table: Optional[Tuple[int, ...]] = None) -> Iterator[Tuple[int, int, int]]:
        """(key, value, the value's address in the table) for each live entry, in insertion order, read CHUNK
        entries at a time (a lookup stops early), with no check that the dict stayed the same (see lookup).
        table: _table(d), when already read."""
        _, start, esize, koff, n, _ = table or self._table(d)
        for first in range(0, n, CHUNK):
            count = min(CHUNK, n - first)
            at = start + first * esize
            raw = self.mem.read(at, count * esize)
            for i in range(count):
                key, value = _QQ.unpack_from(raw, i * esize + koff)
                if key and value:
                    yield key, value, at + i * esize + koff + 8

    def lookup(self, d: int, names: Sequence[str]) -> Tuple[Tuple[int, ...], Dict[str, Tuple[int, int]]]:
        """(d's table (_table), {name: (the address of its value pointer in the table, its key)}) for the names d holds
        (exact str keys), walking the entries in insertion order until every name is found (keys are unique:
        sys.modules has "__main__" among its first entries).

        The target runs on: an insertion appends an entry (the ones read stay put), a deletion clears one in
        place, a resize builds a new table (maybe where an older one was). So a walk holds when the dict still
        has the same table, entry count and size afterwards and each entry found still holds its key (`holds`:
        a name not found was not there either); otherwise, or when the table was caught half built,
        it is read again, ATTEMPTS times at most (then Changed; a table that reads the same wrong way each time
        is a Fault, unless a thread of the target is runnable: Memory.runnable)."""
        want: Dict[int, Any] = {}
        for name in names:
            want.setdefault(len(name), set()).add(name)
        heads = set()
        fault = None
        for attempt in range(ATTEMPTS):
            if attempt:
                _pause(attempt)
            try:
                table = self._table(d)
                found: Dict[str, Tuple[int, int]] = {}
                for key, _, where in self.items(d, table):
                    text = self.ascii_key(key, want)
                    if text is not None and text not in found:
                        found[text] = (where, key)
                        if len(found) == len(names):
                            break
            except Changed:
                heads.add(b"")
                continue
            except Fault as exc:
                fault = exc
                heads.add(self.mem.read(d + self.lay.dict_used, 32))
                continue
            if self.holds(d, table, found):
                return table, found
            heads.add(b"")
        if fault is not None and len(heads) == 1 and not self.mem.runnable():
            raise fault
        raise Changed("the dict changed on each of %d reads" % ATTEMPTS)

    def holds(self, d: int, table: Tuple[int, ...], found: Dict[str, Tuple[int, int]]) -> bool:
        """d still has the same table (_table), and each entry found still holds its key."""
        try:
            if self._table(d) != table:
                return False
        except (Fault, Changed):
            return False
        return all(self.mem.ptr(where - 8) == key for where, key in found.values())

    # -- objects -------------------------------------------------------------------------------------------------

    def ascii_key(self, obj: int, want: Dict[int, Any]) -> Optional[str]:
        """The text of an exact, compact ASCII str whose length is a key of want and whose text is in
        want[length]; None for any other object."""
        lay = self.lay
        head = self.mem.read(obj, lay.str_header)
        if _Q.unpack_from(head, lay.ob_type)[0] != self.types["str"]:
            return None
        length = _q.unpack_from(head, lay.str_length)[0]
        state = _I.unpack_from(head, lay.str_state)[0]
        if length not in want or (state >> 5) & 3 != 3:  # compact and ascii
            return None
        text = self.mem.read(obj + lay.str_header, length).decode("ascii", "replace")
        return text if text in want[length] else None

    def int_text(self, obj: int, kind: str) -> str:
        """An int's (or bool's) decimal text; "<int>" beyond MAX_INT_DIGITS digits."""
        lay = self.lay
        raw = _Q.unpack(self.mem.read(obj + lay.int_size, 8))[0]
        if lay.int_kind == "size":
            size = raw - (1 << 64) if raw >= 1 << 63 else raw
            negative, ndigits = size < 0, abs(size)
        else:
            sign, ndigits = raw & 3, raw >> 3
            if sign == 3 or (sign == 1 and ndigits > 1):
                raise Fault("an int tag of 0x%x" % raw)
            negative = sign == 2
            if sign == 1:
                ndigits = 0
        if ndigits > MAX_INT_DIGITS:
            return "<int>"
        value = 0
        if ndigits:
            data = self.mem.read(obj + lay.int_digits, ndigits * lay.digit_size)
            fmt = "<%d%s" % (ndigits, "I" if lay.digit_size == 4 else "H")
            for i, digit in enumerate(struct.unpack(fmt, data)):
                if digit >> lay.digit_bits:
                    raise Fault("an int digit of 0x%x" % digit)
                value |= digit << (lay.digit_bits * i)
        value = -value if negative else value
        if kind == "bool":
            if value not in (0, 1):
                raise Fault("a bool of %d" % value)
            return "True" if value else "False"
        return str(value)

    def type_name(self, typ: int) -> str:
        """A type's tp_name (its name only, never an instance's contents), letters, digits, `_` and `.`."""
        name_at = self.mem.ptr(typ + self.lay.tp_name)
        if name_at < 4096:
            return "?"
        raw = self.mem.read(name_at, min(MAX_TYPE_NAME, 4096 - name_at % 4096))
        name = raw.split(b"\0", 1)[0].decode("ascii", "replace")
        return name if name and all(c in _NAME_CHARS for c in name) else "?"

    def text(self, obj: int, typ: int) -> str:
        """An int's or bool's text, `<typename>` for anything else."""
        if typ == self.types["int"]:
            return self.int_text(obj, "int")
        if typ == self.types["bool"]:
            return self.int_text(obj, "bool")
        return "<%s>" % self.type_name(typ)

    # -- the chain -------------------------------------------------------------------------------------------

    def main_dict(self) -> int:
        """The __main__ module's dict: _PyRuntime -> main interpreter -> modules dict -> "__main__" -> md_dict."""
        interp = self.mem.ptr(self.runtime + self.lay.interp)
        if interp < 4096:
            raise Fault("no interpreter yet")
        modules = self.expect(self.mem.ptr(interp + self.lay.modules), "dict")
        for attempt in range(ATTEMPTS):
            if attempt:
                _pause(attempt)
            table, found = self.lookup(modules, ["__main__"])
            if "__main__" not in found:
                raise Fault("no __main__ module")
            where = found["__main__"][0]
            module = self.mem.ptr(where)
            try:
                md = self.expect(self.mem.ptr(self.expect(module, "module") + self.lay.md_dict), "dict")
            except Fault:
                if self.holds(modules, table, found) and self.mem.ptr(where) == module:
                    raise
                continue
            if self.holds(modules, table, found) and self.mem.ptr(where) == module:
                return md
        raise Changed("sys.modules changed on each of %d reads" % ATTEMPTS)

    def globals(self, names: Sequence[str]) -> Dict[str, Any]:
        """{"values": {name: text}, "absent": [names __main__ does not hold]}. Each value is read, then the
        table, the entries and the objects read are checked to be still in place and to read the same: a value
        is one that the dict held, never a read of memory that was freed (and reused) meanwhile."""
        d = self.main_dict()
        faults: List[str] = []  # what each read that failed in place said
        for attempt in range(ATTEMPTS):
            if attempt:
                _pause(attempt)
            table, found = self.lookup(d, names)
            read: Dict[str, Tuple[int, int, str]] = {}
            objs: Dict[int, int] = {}  # value slot -> the object read there
            try:
                for name, (where, _) in found.items():
                    obj = objs[where] = self.mem.ptr(where)
                    if obj:  # 0: deleted meanwhile
                        typ = self.type_of(obj)
                        read[name] = (obj, typ, self.text(obj, typ))
            except Fault as exc:
                # in place afterwards is not proof enough: a new int built where a freed one was (the same
                # address, bound to the same name) reads torn while it is written; a fault is one that reads the
                # same way every time
                if self.holds(d, table, found) and all(self.mem.ptr(w) == o for w, o in objs.items()):
                    faults.append(str(exc))
                    # the same fault on every read is the object's, unless a writer of the target may be
                    # preempted halfway through it (runnable): then it is a change not yet finished
                    if len(faults) == ATTEMPTS and len(set(faults)) == 1 and not self.mem.runnable():
                        raise
                continue
            # a table freed by a resize keeps its old entries until its memory is reused (by the next table, at
            # the same address), and an int's memory is reused by the next int: the pointers may all match after
            # a read of stale memory, the contents then do not
            if (self.holds(d, table, found) and all(self.mem.ptr(w) == o for w, o in objs.items())
                    and all(self.type_of(obj) == typ and self.text(obj, typ) == text
                            for obj, typ, text in read.values())):
                return {"values": {name: text for name, (_, _, text) in read.items()},
                        "absent": [n for n in names if n not in found]}
        raise Changed("__main__'s globals changed on each of %d reads" % ATTEMPTS)


def _pause(attempt: int) -> None:
    """Before reading again what the target was caught changing: a writer preempted halfway (a loaded node)
    needs a moment to finish."""
    time.sleep(0.001 * attempt)


def valid_names(names: Any) -> List[str]:
    """The names asked for, each an identifier of at most MAX_NAME_CHARS characters, MAX_NAMES at most."""
    out: List[str] = []
    for name in names if isinstance(names, (list, tuple)) else []:
        if (isinstance(name, str) and 0 < len(name) <= MAX_NAME_CHARS and name.isidentifier()
                and all(ord(c) < 128 for c in name) and name not in out):
            out.append(name)
    return out[:MAX_NAMES]


# -- calibration (runs in the target's interpreter binary) ---------------------------------------------------------


def _scan(mem: Memory, addr: int, size: int, value: int) -> List[int]:
    """Offsets (8-aligned) in [addr, addr + size) that hold the pointer value, MAX_CANDIDATES at most."""
    data = mem.upto(addr, size)
    packed = _Q.pack(value)
    out: List[int] = []
    off = data.find(packed)
    while off >= 0 and len(out) < MAX_CANDIDATES:
        if off % 8 == 0:
            out.append(off)
        off = data.find(packed, off + 1)
    return out


def _dict_ok(reader: Reader, d: Dict[Any, Any]) -> bool:
    try:
        got = {(k, v) for k, v, _ in reader.items(id(d))}
    except (Fault, Changed, struct.error, IndexError):
        return False
    return got == {(id(k), id(v)) for k, v in d.items()}


def _str_ok(reader: Reader, samples: Sequence[str]) -> bool:
    try:
        for s in samples:
            want = {len(s): {s}}
            got = reader.ascii_key(id(s), want)
            if got != (s if all(ord(c) < 128 for c in s) else None):
                return False
    except (Fault, UnicodeDecodeError):
        return False
    return True


def _int_ok(reader: Reader, samples: Sequence[int]) -> bool:
    try:
        for n in samples:
            got = reader.int_text(id(n), "bool" if isinstance(n, bool) else "int")
            want = str(n) if abs(n) < (1 << (reader.lay.digit_bits * MAX_INT_DIGITS)) else "<int>"
            if got != want:
                return False
    except Fault:
        return False
    return True


def calibrate() -> Dict[str, Any]:
    """The layout of this interpreter's objects, checked on its own objects (see the module doc); the probe's
    JSON: {"ok": true, "python", "layout", "files": [{dev, inode, path, base_offset}], "symbols": {name: [file
    index, delta]}} or {"ok": false, "error"}."""
    started = time.monotonic()
    if struct.calcsize("P") != 8 or sys.byteorder != "little":
        return {"ok": False, "error": "unsupported interpreter layout: only 64-bit little-endian builds are read"}
    try:
        import ctypes
    except ImportError as exc:
        return {"ok": False, "error": "this python has no ctypes (%s)" % exc}
    try:
        api = ctypes.pythonapi
        runtime = ctypes.addressof(ctypes.c_char.in_dll(api, "_PyRuntime"))
        main_fn = api.PyInterpreterState_Main
        main_fn.restype, main_fn.argtypes = ctypes.c_void_p, []
        interp = main_fn()
    except (AttributeError, ValueError, OSError) as exc:
        return {"ok": False, "error": "unsupported interpreter: no _PyRuntime (%s)" % exc}
    main = sys.modules["__main__"].__dict__
    markers = {MARKER: MARKER_VALUE, MARKER + "_neg": -12345, MARKER + "_bool": True,
               MARKER + "_str": "not to be read", MARKER + "_float": 0.5}
    main.update(markers)
    try:
        with Memory("self", budget=64 << 20) as mem:
            return _calibrate(mem, runtime, interp, main, markers, started)
    except (OSError, Fault, struct.error) as exc:
        return {"ok": False, "error": "calibration failed: %s" % exc}
    finally:
        for k in markers:
            main.pop(k, None)


def _calibrate(mem: Memory, runtime: int, interp: Any, main: Dict[str, Any], markers: Dict[str, Any],
               started: float) -> Dict[str, Any]:
    maps = read_maps("self")
    files: List[Dict[str, Any]] = []
    symbols: Dict[str, List[int]] = {}
    for name, addr in (("runtime", runtime), ("int", id(int)), ("bool", id(bool)), ("dict", id(dict)),
                       ("str", id(str)), ("module", id(type(sys)))):
        where = locate(addr, maps)
        if where is None:
            return {"ok": False, "error": "unsupported interpreter: %s is in no file mapping" % name}
        key = {k: where[k] for k in ("dev", "inode", "path", "base_offset")}
        if key not in files:
            files.append(key)
        symbols[name] = [files.index(key), where["delta"]]
    types = {"int": id(int), "bool": id(bool), "dict": id(dict), "str": id(str), "module": id(type(sys))}
    big = int("1" * 30)  # an int object of its own (not a cached small int)
    ob_types = _scan(mem, id(big), 64, id(int))
    if not ob_types:
        return {"ok": False, "error": "unsupported interpreter layout: no ob_type in an int"}
    ob_type = ob_types[0]
    module = sys.modules["__main__"]
    md = [o for o in _scan(mem, id(module), OBJECT_SCAN, id(main)) if o > ob_type]
    int_name = _name_ptr(mem, id(int), "int")
    names = [o for o in _scan(mem, id(int), OBJECT_SCAN, int_name) if o > ob_type] if int_name else []
    interps = _scan(mem, runtime, RUNTIME_SCAN, interp) if interp else []
    modules = _scan(mem, interp, INTERP_SCAN, id(sys.modules)) if interp else []
    if not (md and names and interps and modules):
        return {"ok": False, "error": "unsupported interpreter layout: md_dict %s, tp_name %s, interpreters %s, "
                                      "modules %s" % (md[:1], names[:1], interps[:1], modules[:1])}
    base = dict(ob_type=ob_type, md_dict=md[0], tp_name=names[0], dict_used=ob_type + 8,
                str_length=ob_type + 8, str_state=ob_type + 24, int_size=ob_type + 8, int_digits=ob_type + 16,
                digit_bits=sys.int_info.bits_per_digit, digit_size=sys.int_info.sizeof_digit)
    dicts = _sample_dicts(main)
    strs = ["__main__", "iter_num", "x", "_" * 64, "caf\u00e9", "\u20ac uro", "e\U0001F600"]
    ints = [0, 1, 7, -7, 255, 300, -300, (1 << 30) - 1, 1 << 30, -(1 << 61) - 3, (1 << 90) - 1, 1 << 90,
            int("-" + "9" * 40), True, False]
    chosen = {}
    for field, options in (("dict_kind", ("log2", "size")), ("str_header", (ob_type + 32, ob_type + 40)),
                           ("int_kind", ("tag", "size"))):
        passing = []
        for option in options:
            reader = Reader(mem, Layout(**dict(base, **{field: option})), runtime, types)
            ok = (_dict_ok(reader, dicts[0]) and all(_dict_ok(reader, d) for d in dicts) if field == "dict_kind"
                  else _str_ok(reader, strs) if field == "str_header" else _int_ok(reader, ints))
            if ok:
                passing.append(option)
        if len(passing) != 1:
            return {"ok": False, "error": "unsupported interpreter layout: %s: %s of the known layouts read this "
                                          "python's own objects back" % (field, len(passing) or "none")}
        chosen[field] = passing[0]
    # the whole chain, on its own __main__: which of the candidate pointers lead there
    for i_off in interps:
        for m_off in modules:
            lay = Layout(**dict(base, interp=i_off, modules=m_off, **chosen))
            try:
                got = Reader(mem, lay, runtime, types).globals(list(markers) + ["_hangscope_absent"])
            except (Fault, Changed, struct.error):
                continue
            want = {k: (str(v) if isinstance(v, int) else "<%s>" % type(v).__name__) for k, v in markers.items()}
            if got["values"] == want and got["absent"] == ["_hangscope_absent"]:
                return {"ok": True, "python": sys.version.split()[0], "layout": lay.as_dict(), "files": files,
                        "symbols": symbols, "ms": round((time.monotonic() - started) * 1000, 2)}
    return {"ok": False, "error": "unsupported interpreter layout: no path from _PyRuntime to this python's own "
                                  "__main__ globals"}


def _name_ptr(mem: Memory, typ: int, name: str) -> int:
    """The address of the C string `name` that type object typ points to (its tp_name), or 0."""
    want = name.encode() + b"\0"
    data = mem.upto(typ, OBJECT_SCAN)
    for off in range(0, len(data) - 7, 8):
        p = _Q.unpack_from(data, off)[0]
        if p > 4096:
            try:
                if mem.read(p, len(want)) == want:
                    return p
            except Fault:
                continue
    return 0


def _sample_dicts(main: Dict[str, Any]) -> List[Dict[Any, Any]]:
    """Dicts of every shape the reader meets: str keys with a deleted entry, mixed keys, 2-byte indices, a
    module's globals, sys.modules."""
    small = {"alpha": 1, "beta": "b", "gamma": None}
    del small["beta"]
    mixed = {1: "a", "b": 2, (3,): 4}
    wide = {"k%d" % i: i for i in range(300)}
    return [small, mixed, wide, main, sys.modules]


def to_json(value: Any) -> str:
    """JSON text of the probe's answer (dicts, lists, str, int, bool): the json module would import re and enum,
    a third of the probe's run time."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        out = []
        for c in value:
            n = ord(c)
            if 32 <= n < 127 and c not in "\"\\":
                out.append(c)
            elif n < 0x10000:
                out.append("\\u%04x" % n)
            else:
                n -= 0x10000
                out.append("\\u%04x\\u%04x" % (0xD800 + (n >> 10), 0xDC00 + (n & 0x3FF)))
        return '"' + "".join(out) + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(to_json(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(to_json(str(k)) + ": " + to_json(v) for k, v in value.items()) + "}"
    return "null"


if __name__ == "__main__":
    sys.stdout.write(to_json(calibrate()) + "\n")
