"""Hosts input: hosts files, stdin and `-w` node lists turned into a checked, de-duplicated list of HostSpec.

Pure parsing: this module never connects, resolves names or runs anything, and everything it accepts is safe
to hand to ssh as a host argument. One entry per line; a line may also hold comma-separated entries, and
`key=value` options after the host apply to every entry on the line:

    node01                       a host name (RFC 1123 labels, `_` allowed) or an IPv4 address
    node01 slots=8               options, separated by spaces or tabs (DeepSpeed / Open MPI hostfile spelling,
                                 `slots = 8` too); keys: slots, port, user
    node01:8                     host:N means N SLOTS (the MPI hostfile convention), never a port
    user@node01:2222             with a user, host:N is the PORT, as for ssh/scp
    [node01]:2222  [fe80::1]:22  after brackets, the number is the PORT
    fe80::1                      a bare IPv6 address (no port: write [fe80::1]:PORT for one)
    gpu[001-004,010]             a SLURM/pdsh node list, expanded by ClusterShell's NodeSet in its sorted order;
                                 groups (@name) are never resolved
    # comments (whole-line and trailing), blank lines, CRLF, a UTF-8 BOM, tabs, trailing spaces

So a port is only ever `user@host:PORT`, `[host]:PORT` or `port=PORT`. Entries with the same user, host and
port are kept once (first place wins, with a warning naming both places). Anything else is a HostsError naming
the source, the line and the text, raised before anything connects.

Every parse here is linear in the input's length: node lists are read by a scanner (one pass, no regular
expression that can backtrack), counted from their text before anything is expanded (the count stops growing
past --max-hosts, so `a[1-2]` 20,000 times is a message, not a 6,000-digit number), and only a list within the
limit is handed to ClusterShell's NodeSet to expand. A bad list is refused naming the character where it goes
wrong (an unclosed `[`, a zero-width space, ...). Regular expressions left here match bounded text (a line of at
most MAX_LINE_CHARS, a name of at most 253 characters) and have no nested repeats.
"""

from __future__ import annotations

import ipaddress
import re
import sys
import unicodedata
from collections import Counter
from dataclasses import dataclass, replace
from typing import BinaryIO, Callable, Iterator, Literal, NoReturn

from ClusterShell.NodeSet import RESOLVER_NOGROUP, NodeSet, NodeSetException

from app.errors import HostsError
from app.inputs.files import InputFileError, open_input, read_bounded, stdin_problem

DEFAULT_MAX_HOSTS = 10000
# Hosts input is read bounded: `hangscope /dev/zero` or `yes node1 | hangscope -` must end in a message, not
# in all of the memory. 100,000 nodes with comments and options fit many times over.
MAX_INPUT_BYTES = 32 << 20
MAX_LINES = 1_000_000  # blank and comment lines included
MAX_LINE_CHARS = 4096
MAX_SLOTS = 4096  # ranks expected on one node: the TUI draws a cell for each, so it is bounded too
MAX_WARNINGS = 20  # duplicate warnings printed one by one; the rest are counted
Fail = Callable[..., HostsError]  # builds the error for the current line: fail(reason, text=...)
KEYS = ("slots", "port", "user")

_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")  # tab is whitespace
_CONTROL_IN_TEXT = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]|\r(?!\n|\Z)")  # CRLF line ends are fine
_META = re.compile(r"""[;|&$`'"<>()*?!{}\\]""")
_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_HOSTNAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*", re.ASCII)
_PLAIN = re.compile(rf"({_LABEL}(?:\.{_LABEL})*)(?:[ \t]+slots[ \t]*=[ \t]*([0-9]{{1,9}}))?", re.ASCII)
_USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}", re.ASCII)
_NUMBER = re.compile(r"[0-9]{1,9}", re.ASCII)  # bounded: int() of a megabyte of digits is slow
_DOTTED_NUMBERS = re.compile(r"[0-9.]+", re.ASCII)
_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")
_DIGITS = frozenset("0123456789")
MAX_COUNT = 10 ** 18  # a node list's count stops growing here: `a[1-2]` 20,000 times is not a 6,000-digit number
MAX_ENTRIES = 1_000_000  # names all node lists of one input may expand to, repeats included (10 x --max-hosts)
MAX_RANGE_DIGITS = 9  # a node number of more digits is not a node number (and int() of thousands is slow)
TransportKind = Literal["ssh", "srun", "auto", "local"]
_ZONE = re.compile(r"[A-Za-z0-9_.-]+", re.ASCII)
_COLON_RULE = ("host:N means N slots (MPI hostfile style); for a port write user@host:PORT, [host]:PORT "
               "or port=PORT")


@dataclass(frozen=True)
class HostSpec:
    """One node to connect to, and where it was written."""

    name: str  # unique display name: the host as written, plus ":port" (then "user@") only to tell apart
    host: str  # what to connect to: a name, IPv4, or IPv6 (no brackets)
    user: str | None = None
    port: int | None = None
    slots: int | None = None  # expected number of ranks on this node
    source: str = ""  # file name, "<stdin>" or "-w"
    line: int | None = None
    # how to open its worker (app.transport.connect): ssh; srun into a SLURM job's allocation (--slurm); auto
    # (SSH, srun where SSH cannot get in); local (this machine, no SSH: no hosts given)
    transport: TransportKind = "ssh"

    @property
    def key(self) -> tuple[str | None, str, int | None]:
        """Identity for de-duplication: names are case-insensitive, IPv6 compared in canonical form."""
        host = self.host.lower()
        if ":" in host:
            host = str(ipaddress.IPv6Address(host))
        return (self.user, host, self.port)

    @property
    def where(self) -> str:
        return f"{self.source}:{self.line}" if self.line is not None else self.source


@dataclass(frozen=True)
class HostList:
    """Hosts in input order, and warnings (duplicates, suspicious slot counts) for the user to read."""

    hosts: tuple[HostSpec, ...] = ()
    warnings: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self.hosts)

    def __iter__(self) -> Iterator[HostSpec]:
        return iter(self.hosts)


class _Collector:
    """Accumulates unique hosts in order, warns on duplicates, enforces max_hosts as hosts arrive."""

    def __init__(self, max_hosts: int | None) -> None:
        self.max_hosts = max_hosts
        self.seen: dict[tuple[str | None, str, int | None], HostSpec] = {}
        self.warnings: list[str] = []
        self.more_duplicates = 0
        self.entries = 0  # node-list names produced, duplicates included (bounded by MAX_ENTRIES)
        self.lists: dict[tuple[str, str | None, int | None, int | None], str] = {}  # node list -> where first

    def add(self, spec: HostSpec, key: tuple[str | None, str, int | None] | None = None) -> None:
        key = key or spec.key
        first = self.seen.get(key)
        if first is not None:
            differs = spec.slots is not None and spec.slots != first.slots
            extra = f", keeping slots={first.slots} not {spec.slots}" if differs else ""
            if len(self.warnings) >= MAX_WARNINGS:
                self.more_duplicates += 1
                return
            self.warnings.append(f"{spec.where}: {spec.name} is listed again (first at {first.where}); "
                                 f"ignored{extra}")
            return
        if self.max_hosts is not None and len(self.seen) >= self.max_hosts:
            _too_many(spec.source, spec.line, f"more than {self.max_hosts} hosts", self.max_hosts)
        self.seen[key] = spec

    def result(self, source: str | None, empty: str = "") -> HostList:
        if source is not None and not self.seen:
            raise HostsError(source, None, "", empty)
        more = (f"{self.more_duplicates} more repeated host line(s) ignored",) if self.more_duplicates else ()
        return HostList(_unique_names(self.seen), tuple(self.warnings) + more)


def _too_many(source: str, line: int | None, what: str, limit: int) -> NoReturn:
    raise HostsError(source, line, "", f"{what}; the limit is {limit}, raise it with --max-hosts N")


def _clip(text: str) -> str:
    return text if len(text) <= 200 else text[:200] + "..."


def parse_hosts(data: bytes | str, source: str, *, max_hosts: int | None = DEFAULT_MAX_HOSTS) -> HostList:
    """Parse a hosts file's contents; raises HostsError on the first bad line, or when it lists no host."""
    # lines as a text editor counts them: a final newline ends the last line, it does not start another
    ends = data.endswith(b"\n") if isinstance(data, bytes) else data.endswith("\n")
    lines = (data.count(b"\n") if isinstance(data, bytes) else data.count("\n")) + (0 if ends or not data else 1)
    if len(data) > MAX_INPUT_BYTES or lines > MAX_LINES:
        what = f"more than {MAX_INPUT_BYTES >> 20} MiB" if len(data) > MAX_INPUT_BYTES else f"more than {MAX_LINES} lines"
        raise HostsError(source, None, "", f"{what}: larger than any hosts input (the limits are {MAX_INPUT_BYTES >> 20} "
                         f"MiB and {MAX_LINES} lines); is this the right file?")
    if isinstance(data, bytes):
        encoded = data
        try:
            data = encoded.decode("utf-8")
        except UnicodeDecodeError as e:
            lineno = encoded.count(b"\n", 0, e.start) + 1
            start = encoded.rfind(b"\n", 0, e.start) + 1
            end = encoded.find(b"\n", e.start)
            undecoded = encoded[start:end if end >= 0 else len(encoded)].decode("utf-8", "backslashreplace")
            raise HostsError(source, lineno, _clip(undecoded), "not valid UTF-8") from None
    if data.startswith("\ufeff"):
        data = data[1:]
    bad = _CONTROL_IN_TEXT.search(data)  # one scan of the whole text instead of one per line
    if bad:
        lineno = data.count("\n", 0, bad.start()) + 1
        raw = data.split("\n")[lineno - 1]
        raise HostsError(source, lineno, _clip(raw), f"control character U+{ord(bad.group()[0]):04X}")
    out = _Collector(max_hosts)
    for lineno, raw in enumerate(data.split("\n"), 1):
        if "#" in raw:
            raw = raw[: raw.index("#")]
        content = raw.strip()
        if not content:
            continue
        if len(content) > MAX_LINE_CHARS:
            raise HostsError(source, lineno, _clip(content), f"a line longer than {MAX_LINE_CHARS} characters")
        plain = _PLAIN.fullmatch(content)  # fast path for "name" and "name slots=N", the bulk of big files
        slots = int(plain[2]) if plain and plain[2] else None
        if plain and slots != 0 and (slots is None or slots <= MAX_SLOTS) and len(plain[1]) <= 253 and not _DOTTED_NUMBERS.fullmatch(plain[1]):
            host = plain[1]
            key = (None, host.lower(), None)
            if key in out.seen and len(out.warnings) >= MAX_WARNINGS:
                out.more_duplicates += 1  # a million repeated lines: counted, not each built and warned about
                continue
            out.add(HostSpec(host, host, None, None, slots, source, lineno), key)
        else:
            _parse_line(content, source, lineno, out)
    return out.result(source, "no hosts in this file (only blank lines and comments)")


def read_hosts(path: str, *, stdin: BinaryIO | None = None, max_hosts: int | None = DEFAULT_MAX_HOSTS) -> HostList:
    """Read and parse a hosts file; "-" reads stdin (source "<stdin>"). Only a regular file is opened (a FIFO
    with no writer would block for ever, a device never ends): anything else is a HostsError naming its type."""
    if path == "-":
        problem = stdin_problem() if stdin is None else None
        stream = stdin if stdin is not None else sys.stdin.buffer if sys.stdin is not None and not problem else None
        if stream is None:
            raise HostsError("<stdin>", None, "", problem or "stdin is closed")
        return parse_hosts(_read_bounded(stream), "<stdin>", max_hosts=max_hosts)
    try:
        with open_input(path, what="hosts file", stdin_ok=True) as f:
            data = _read_bounded(f)
    except InputFileError as exc:
        raise HostsError(path, None, "", exc.reason) from None
    except OSError as exc:
        raise HostsError(path, None, "", f"cannot read: {exc.strerror or exc}") from None
    return parse_hosts(data, path, max_hosts=max_hosts)


def _read_bounded(stream: BinaryIO) -> bytes:
    """At most MAX_INPUT_BYTES + 1 bytes, or MAX_LINES + 1 lines: enough for parse_hosts to refuse the input."""
    return read_bounded(stream, MAX_INPUT_BYTES, max_lines=MAX_LINES)


def parse_nodelist(arg: str, source: str = "-w", *, max_hosts: int | None = DEFAULT_MAX_HOSTS) -> HostList:
    """Parse a `-w` argument: comma-separated entries, each a host or node list, e.g. `gpu[001-004],login1`."""
    bad = _CONTROL.search(arg)
    if bad:
        raise HostsError(source, None, _clip(arg), f"control character U+{ord(bad.group()):04X}")
    _check_ascii(arg, lambda reason, text=arg: HostsError(source, None, _clip(text), reason))
    out = _Collector(max_hosts)
    if arg.strip():  # spaces around commas are a common way to write -w "a, b": allowed there only
        joined = ",".join(part.strip() for part in arg.strip().split(","))  # linear, unlike a \s*,\s* regex
        _parse_line(joined, source, None, out, options_allowed=False)
    return out.result(source, "no hosts given")


def _check_ascii(text: str, fail: Fail) -> None:
    """Host names and node lists are ASCII: name the first character that is not, and where it is (a
    zero-width space or a non-breaking space pasted from a web page cannot be seen)."""
    if text.isascii():
        return
    i = next(i for i, ch in enumerate(text) if ord(ch) > 127)
    name = unicodedata.name(text[i], "").lower()
    raise fail(f"not a valid host name: character {i + 1} is U+{ord(text[i]):04X}{f' ({name})' if name else ''}; "
               "host names and node lists are ASCII")


def merge(*lists: HostList, max_hosts: int | None = None) -> HostList:
    """Join host lists in order, keeping the first of entries repeated across sources (with a warning)."""
    out = _Collector(max_hosts)
    warnings: list[str] = []
    for hosts in lists:
        warnings.extend(hosts.warnings)
        for spec in hosts.hosts:
            out.add(spec)
    merged = out.result(None)
    return HostList(merged.hosts, tuple(warnings) + merged.warnings)


def _parse_line(content: str, source: str, line: int | None, out: _Collector, options_allowed: bool = True
                ) -> None:
    """Add one line's (or one -w argument's) hosts to `out`; raises HostsError at the first problem."""
    def fail(reason: str, text: str = content) -> HostsError:
        return HostsError(source, line, _clip(text), reason)

    if content.startswith("-"):
        raise fail("a host cannot start with '-' (ssh would read it as an option)")
    meta = _META.search(content)
    if meta:
        raise fail(f"shell metacharacter {meta.group()!r} is not allowed")
    _check_ascii(content, fail)
    fields = _join_equals(content).split() if "=" in content else content.split()
    opts: dict[str, str] = {}
    for field in fields[1:]:
        key, eq, value = field.partition("=")
        if not options_allowed:
            raise fail("spaces are not allowed in a node list (separate hosts with commas)")
        if not eq:
            raise fail(f"unexpected {field!r} after the host: a host name cannot contain spaces, and only "
                       f"key=value options ({', '.join(KEYS)}) may follow it")
        if key not in KEYS:
            raise fail(f"unknown option {key!r} (known: {', '.join(KEYS)})")
        if key in opts:
            raise fail(f"option {key!r} given twice")
        opts[key] = value
    if fields[0].partition("=")[0] in KEYS:
        raise fail("a line must start with a host, options come after it")
    slots = _number(opts["slots"], "slots", fail, MAX_SLOTS) if "slots" in opts else None
    port = _number(opts["port"], "port", fail, 65535) if "port" in opts else None
    user = opts.get("user")
    if user is not None and not _USER.fullmatch(user):
        raise fail(f"invalid user name {user!r}")
    for item in _split_commas(fields[0], fail):
        _parse_item(item, slots, port, user, source, line, out, fail)


def _join_equals(content: str) -> str:
    """`slots = 8` as `slots=8`: the blanks around each `=` removed, in one pass."""
    parts = content.split("=")
    return "=".join([parts[0].rstrip(" \t")] + [p.strip(" \t") for p in parts[1:-1]] + [parts[-1].lstrip(" \t")])


def _split_commas(text: str, fail: Fail) -> list[str]:
    """Split on commas outside brackets: `gpu[1,3],login1` is two entries (one pass; brackets do not nest)."""
    if "," not in text:
        return [text]
    items, start, depth = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth = max(0, depth - 1)
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    if "" in items:
        raise fail("empty entry between commas")
    return items


def _parse_item(item: str, slots: int | None, port: int | None, user: str | None, source: str,
                line: int | None, out: _Collector, fail: Fail) -> None:
    rest = item
    if item.startswith("-"):
        raise fail("a host cannot start with '-' (ssh would read it as an option)", item)
    if "@" in item:
        item_user, _, rest = item.partition("@")
        if not item_user or "@" in rest:
            raise fail("node groups (@name) are never resolved: list the nodes, e.g. gpu[01-08]", item)
        if user is not None:
            raise fail("user given twice (user@ and user=)", item)
        if not _USER.fullmatch(item_user):
            raise fail(f"invalid user name {item_user!r}", item)
        user = item_user
    if not rest or rest.startswith("-"):
        raise fail("missing host, or a host starting with '-'", item)
    item_port = item_slots = None
    if rest.startswith("["):  # [host]:port or [IPv6]:port
        close = rest.find("]")
        host, after = rest[1:close], rest[close + 1:]
        if close < 0 or "[" in host or (after and not after.startswith(":")):
            raise fail("expected [HOST] or [HOST]:PORT", item)
        item_port = _number(after[1:], "port", fail, 65535) if after else None
    elif rest.count(":") > 1:
        host = rest  # bare IPv6: a trailing ":N" cannot be told from the address, so no port here
    elif ":" in rest:
        host, _, number = rest.partition(":")
        if "@" in item:
            item_port = _number(number, "port", fail, 65535)
        else:
            item_slots = _number(number, "slots", fail, MAX_SLOTS, rule=_COLON_RULE)
            if slots is not None:
                raise fail(f"slots given twice ({_COLON_RULE})", item)
            if item_slots > 1024:
                out.warnings.append(f"{source}{'' if line is None else f':{line}'}: {item} is read as "
                                    f"{item_slots} slots; {_COLON_RULE}")
    else:
        host = rest
    if item_port is not None and port is not None:
        raise fail("port given twice", item)
    port = item_port if item_port is not None else port
    slots = item_slots if item_slots is not None else slots
    if "[" in host:
        where = f"{source}{'' if line is None else f':{line}'}"
        first = out.lists.get((host, user, port, slots))
        if first is not None:  # the same node list again: all its names are repeats, no need to expand them
            if len(out.warnings) < MAX_WARNINGS:
                out.warnings.append(f"{where}: {_clip(host)} is listed again (first at {first}); ignored")
            else:
                out.more_duplicates += 1
            return
        names = _expand(host, out, source, line, fail)
        out.lists[(host, user, port, slots)] = where
    else:
        names = [host]
    for name in names:
        _check_host(name, fail)
        out.add(HostSpec(name, name, user, port, slots, source, line))


def _expand(nodes: str, out: _Collector, source: str, line: int | None, fail: Fail) -> list[str]:
    """Expand a node list with NodeSet, after checking and counting it from its text in one pass, so that a
    malformed list is named where it goes wrong and a huge one never materialises; names produced in all,
    duplicates included, are bounded by MAX_ENTRIES (overlapping lists on a million lines would be hours)."""
    count = _count_nodes(nodes, fail)
    max_hosts = out.max_hosts
    if max_hosts is not None and count > max_hosts:
        many = f"{count}" if count < MAX_COUNT else f"more than {MAX_COUNT}"
        _too_many(source, line, f"{_clip(nodes)} expands to {many} hosts", max_hosts)
    out.entries += count
    limit = min(MAX_ENTRIES, max(100_000, 10 * (max_hosts or DEFAULT_MAX_HOSTS)))
    if out.entries > limit:
        raise fail(f"the node lists so far expand to more than {limit} names, repeats included (10 x --max-hosts): "
                   "larger than any hosts input", nodes)
    try:
        return list(NodeSet(nodes, resolver=RESOLVER_NOGROUP))
    except NodeSetException as e:
        raise fail(f"malformed node list: {e}", nodes) from None


def _count_nodes(nodes: str, fail: Fail) -> int:
    """How many names `nodes` (e.g. `gpu[001-004,010]-ib`) expands to, capped at MAX_COUNT; a HostsError
    naming the character where the list goes wrong. One pass over the text."""
    count, i, n = 1, 0, len(nodes)
    while i < n:
        ch = nodes[i]
        if ch in _NAME_CHARS:
            i += 1
        elif ch == "[":
            close = nodes.find("]", i + 1)
            inner = nodes[i + 1:close] if close >= 0 else nodes[i + 1:]
            nested = inner.find("[")
            if nested >= 0:
                raise fail("malformed node list: " f"'[' at character {i + 1} is followed by another '[' (at {i + 2 + nested}) before its "
                           "']': node lists do not nest", nodes)
            if close < 0:
                raise fail("malformed node list: " f"the '[' at character {i + 1} is never closed (a missing ']')", nodes)
            count = min(count * _count_ranges(inner, i + 2, nodes, fail), MAX_COUNT)
            i = close + 1
        elif ch == "]":
            raise fail("malformed node list: " f"']' at character {i + 1} closes no '['", nodes)
        else:
            raise fail("malformed node list: " f"{ch!r} at character {i + 1} cannot be in a node list (expected e.g. gpu[001-004,010])",
                       nodes)
    return count


def _count_ranges(ranges: str, at: int, nodes: str, fail: Fail) -> int:
    """The size of a bracket's range list (`001-004,010`, `0-30/2`); `at`: where it starts in `nodes`."""
    size = 0
    for part in ranges.split(","):
        where = f"at character {at}"
        at += len(part) + 1
        if not part:
            raise fail("malformed node list: " f"an empty range {where} (in [{_clip(ranges)}])", nodes)
        lo_text, dash, rest = part.partition("-")
        hi_text, slash, step_text = rest.partition("/")
        numbers = [lo_text] + ([hi_text] if dash else []) + ([step_text] if slash else [])
        if not all(t and set(t) <= _DIGITS for t in numbers):
            raise fail("malformed node list: " f"malformed range {_clip(part)!r} {where}: expected N, N-M or N-M/STEP in ASCII digits", nodes)
        if any(len(t) > MAX_RANGE_DIGITS for t in numbers):
            raise fail("malformed node list: " f"a number of more than {MAX_RANGE_DIGITS} digits in range {_clip(part)!r} {where}", nodes)
        lo, hi, step = int(lo_text), int(hi_text) if dash else int(lo_text), int(step_text) if slash else 1
        if hi < lo:
            raise fail("malformed node list: " f"range {part!r} {where} runs backwards", nodes)
        if step < 1:
            raise fail("malformed node list: " f"range {part!r} {where} has a step of 0", nodes)
        size += (hi - lo) // step + 1
    return size


def _check_host(host: str, fail: Fail) -> None:
    if ":" in host:
        address, pct, zone = host.partition("%")
        try:
            ipaddress.IPv6Address(address)
        except ValueError:
            raise fail("not a valid IPv6 address (write [ADDRESS]:PORT to give a port)", host) from None
        if pct and not _ZONE.fullmatch(zone):
            raise fail("invalid IPv6 zone", host)
    elif _DOTTED_NUMBERS.fullmatch(host):
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            raise fail("not a valid IPv4 address", host) from None
    elif len(host) > 253 or not _HOSTNAME.fullmatch(host):
        raise fail("not a valid host name (letters, digits, '-', '_' in dot-separated labels of at most "
                   "63 characters)", host)


def _number(text: str, what: str, fail: Fail, top: int = 999999999, rule: str = "") -> int:
    if not _NUMBER.fullmatch(text) or not 1 <= int(text) <= top:
        raise fail(f"{what} must be an integer from 1 to {top}, not {text!r}" + (f" ({rule})" if rule else ""))
    return int(text)


def _unique_names(seen: dict[tuple[str | None, str, int | None], HostSpec]) -> tuple[HostSpec, ...]:
    """Name each host as written; add ":port", then "user@", only where two entries would look alike."""
    hosts = Counter(host for _, host, _ in seen)
    pairs = Counter((host, port) for _, host, port in seen)
    out = []
    for (_, host, port), s in seen.items():
        name = s.host
        if hosts[host] > 1:
            if port is not None:
                name = f"[{s.host}]:{port}" if ":" in s.host else f"{s.host}:{port}"
            if pairs[(host, port)] > 1 and s.user is not None:
                name = f"{s.user}@{name}"
        out.append(s if s.name == name else replace(s, name=name))
    return tuple(out)
