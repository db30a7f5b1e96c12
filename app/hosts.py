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
"""

from __future__ import annotations

import errno
import ipaddress
import re
import sys
from collections import Counter
from dataclasses import dataclass, replace
from typing import BinaryIO, Callable, Iterator, Literal, NoReturn

from ClusterShell.NodeSet import RESOLVER_NOGROUP, NodeSet, NodeSetException

from app.errors import HostsError

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
_NODELIST = re.compile(r"(?:[A-Za-z0-9_.-]+|\[[^\[\]]*\])+", re.ASCII)
_BRACKET = re.compile(r"\[([^\[\]]*)\]")
_RANGE = re.compile(r"([0-9]{1,9})(?:-([0-9]{1,9})(?:/([0-9]{1,9}))?)?", re.ASCII)
TransportKind = Literal["ssh", "srun", "auto", "local"]
_EQUALS = re.compile(r"[ \t]*=[ \t]*")
_COMMA_SPACES = re.compile(r"\s*,\s*")
_TOP_COMMA = re.compile(r",(?![^\[\]]*\])")  # a comma not inside [...] (node lists do not nest)
_ZONE = re.compile(r"[A-Za-z0-9_.-]+", re.ASCII)
_OS_REASONS = {errno.ENOENT: "no such file", errno.EISDIR: "is a directory, not a hosts file",
               errno.EACCES: "permission denied"}
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
    err = HostsError(source, line, "", f"{what}; the limit is {limit}, raise it with --max-hosts N")
    err.hint = f"pass --max-hosts N with N of at least the number of nodes (now {limit})"
    raise err


def _clip(text: str) -> str:
    return text if len(text) <= 200 else text[:200] + "..."


def parse_hosts(data: bytes | str, source: str, *, max_hosts: int | None = DEFAULT_MAX_HOSTS) -> HostList:
    """Parse a hosts file's contents; raises HostsError on the first bad line, or when it lists no host."""
    lines = (data.count(b"\n") if isinstance(data, bytes) else data.count("\n")) + 1
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
            out.add(HostSpec(host, host, None, None, slots, source, lineno), (None, host.lower(), None))
        else:
            _parse_line(content, source, lineno, out)
    return out.result(source, "no hosts in this file (only blank lines and comments)")


def read_hosts(path: str, *, stdin: BinaryIO | None = None, max_hosts: int | None = DEFAULT_MAX_HOSTS) -> HostList:
    """Read and parse a hosts file; "-" reads stdin (source "<stdin>")."""
    if path == "-":
        stream = stdin if stdin is not None else sys.stdin.buffer
        return parse_hosts(_read_bounded(stream), "<stdin>", max_hosts=max_hosts)
    try:
        with open(path, "rb") as f:
            data = _read_bounded(f)
    except OSError as e:
        reason = _OS_REASONS.get(e.errno or 0, f"cannot read: {e.strerror or e}")
        raise HostsError(path, None, "", reason) from None
    return parse_hosts(data, path, max_hosts=max_hosts)


def _read_bounded(stream: BinaryIO) -> bytes:
    """At most MAX_INPUT_BYTES + 1 bytes, or MAX_LINES + 1 lines: enough for parse_hosts to refuse the input."""
    chunks: list[bytes] = []
    size = lines = 0
    while size <= MAX_INPUT_BYTES and lines <= MAX_LINES:
        chunk = stream.read(min(1 << 20, MAX_INPUT_BYTES + 1 - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
        lines += chunk.count(b"\n")
    return b"".join(chunks)


def parse_nodelist(arg: str, source: str = "-w", *, max_hosts: int | None = DEFAULT_MAX_HOSTS) -> HostList:
    """Parse a `-w` argument: comma-separated entries, each a host or node list, e.g. `gpu[001-004],login1`."""
    bad = _CONTROL.search(arg)
    if bad:
        raise HostsError(source, None, _clip(arg), f"control character U+{ord(bad.group()):04X}")
    out = _Collector(max_hosts)
    if arg.strip():  # spaces around commas are a common way to write -w "a, b": allowed there only
        _parse_line(_COMMA_SPACES.sub(",", arg.strip()), source, None, out, options_allowed=False)
    return out.result(source, "no hosts given")


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
    fields = _EQUALS.sub("=", content).split() if "=" in content else content.split()
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


def _split_commas(text: str, fail: Fail) -> list[str]:
    """Split on commas outside brackets: `gpu[1,3],login1` is two entries."""
    items = _TOP_COMMA.split(text) if "," in text else [text]
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
    names = _expand(host, out.max_hosts, source, line, fail) if "[" in host else [host]
    for name in names:
        _check_host(name, fail)
        out.add(HostSpec(name, name, user, port, slots, source, line))


def _expand(nodes: str, max_hosts: int | None, source: str, line: int | None, fail: Fail) -> list[str]:
    """Expand a node list with NodeSet, after counting it from the text so a huge range never materialises."""
    if not _NODELIST.fullmatch(nodes):
        raise fail("malformed node list (expected e.g. gpu[001-004,010])", nodes)
    count = 1
    for ranges in _BRACKET.findall(nodes):
        size = 0
        for part in ranges.split(","):
            m = _RANGE.fullmatch(part)
            if not m:
                raise fail(f"malformed range {part!r} in node list", nodes)
            lo, hi, step = int(m[1]), int(m[2] or m[1]), int(m[3] or 1)
            size += max(0, (hi - lo) // step + 1) if step else 0
        count *= size
    if max_hosts is not None and count > max_hosts:
        _too_many(source, line, f"{nodes} expands to {count} hosts", max_hosts)
    try:
        return list(NodeSet(nodes, resolver=RESOLVER_NOGROUP))
    except NodeSetException as e:
        raise fail(f"malformed node list: {e}", nodes) from None


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
