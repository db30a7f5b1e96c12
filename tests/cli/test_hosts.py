"""Tests for app/hosts.py: every accepted hosts format, every rejection, stdin, -w, merging and limits."""

from __future__ import annotations

import io
import ipaddress
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.errors import HostsError, InputError
from app.hosts import HostList, HostSpec, merge, parse_hosts, parse_nodelist, read_hosts

REPO = Path(__file__).resolve().parents[2]


def fields(hosts: HostList) -> list[tuple]:
    return [(h.name, h.host, h.user, h.port, h.slots) for h in hosts]


# (line as written, expected (name, host, user, port, slots) for each host it gives)
ACCEPTED = [
    ("node01", [("node01", "node01", None, None, None)]),
    ("node01 slots=8", [("node01", "node01", None, None, 8)]),
    ("node01   slots = 8", [("node01", "node01", None, None, 8)]),
    ("node01\tslots=8\t", [("node01", "node01", None, None, 8)]),
    ("node01:8", [("node01", "node01", None, None, 8)]),
    ("user@node01:2222", [("node01", "node01", "user", 2222, None)]),
    ("user@node01", [("node01", "node01", "user", None, None)]),
    ("node01 port=2222 user=bob slots=4", [("node01", "node01", "bob", 2222, 4)]),
    ("node01:8 port=2222", [("node01", "node01", None, 2222, 8)]),
    ("[node01]:2222", [("node01", "node01", None, 2222, None)]),
    ("[node01]", [("node01", "node01", None, None, None)]),
    ("10.1.2.3", [("10.1.2.3", "10.1.2.3", None, None, None)]),
    ("10.1.2.3:4", [("10.1.2.3", "10.1.2.3", None, None, 4)]),
    ("[fe80::1]:22", [("fe80::1", "fe80::1", None, 22, None)]),
    ("root@[2001:db8::7]:2200", [("2001:db8::7", "2001:db8::7", "root", 2200, None)]),
    ("fe80::1", [("fe80::1", "fe80::1", None, None, None)]),
    ("fe80::1%eth0", [("fe80::1%eth0", "fe80::1%eth0", None, None, None)]),
    ("gpu_node-7.cluster.local", [("gpu_node-7.cluster.local", "gpu_node-7.cluster.local", None, None, None)]),
    ("gpu[001-003,010] slots=8", [(f"gpu{n}", f"gpu{n}", None, None, 8) for n in ("001", "002", "003", "010")]),
    ("gpu[1-2]:4", [("gpu1", "gpu1", None, None, 4), ("gpu2", "gpu2", None, None, 4)]),
    ("u@gpu[1-2].ib:2222", [("gpu1.ib", "gpu1.ib", "u", 2222, None), ("gpu2.ib", "gpu2.ib", "u", 2222, None)]),
    ("10.0.0.[1-2]", [("10.0.0.1", "10.0.0.1", None, None, None), ("10.0.0.2", "10.0.0.2", None, None, None)]),
    ("n[1-7/3]", [("n1", "n1", None, None, None), ("n4", "n4", None, None, None), ("n7", "n7", None, None, None)]),
    ("a,b slots=2", [("a", "a", None, None, 2), ("b", "b", None, None, 2)]),
    ("node01 # the big one", [("node01", "node01", None, None, None)]),
    ("node01#no space", [("node01", "node01", None, None, None)]),
]


@pytest.mark.parametrize("line,expected", ACCEPTED, ids=[a for a, _ in ACCEPTED])
def test_every_accepted_form_gives_exact_hosts(line: str, expected: list[tuple]) -> None:
    hosts = parse_hosts(f"# header\n\n{line}\n", "h.txt")
    assert fields(hosts) == expected
    assert {(h.source, h.line) for h in hosts} == {("h.txt", 3)}
    assert hosts.warnings == ()


def test_golden_file_keeps_order_and_places() -> None:
    text = "node02 slots=8\nnode01:8\n\n# rack 2\nu@node03:2222\n[fe80::2]:22\ngpu[2-3]\n"
    assert parse_hosts(text, "hosts.txt").hosts == (
        HostSpec("node02", "node02", None, None, 8, "hosts.txt", 1),
        HostSpec("node01", "node01", None, None, 8, "hosts.txt", 2),
        HostSpec("node03", "node03", "u", 2222, None, "hosts.txt", 5),
        HostSpec("fe80::2", "fe80::2", None, 22, None, "hosts.txt", 6),
        HostSpec("gpu2", "gpu2", None, None, None, "hosts.txt", 7),
        HostSpec("gpu3", "gpu3", None, None, None, "hosts.txt", 7),
    )


def test_crlf_bom_tabs_comments_give_the_same_hosts_as_a_clean_file() -> None:
    clean = "node01 slots=8\nu@node02:2222\ngpu[1-2]\n10.0.0.1\n"
    messy = "\ufeff\tnode01\t slots=8  # eight GPUs\r\nu@node02:2222   \r\n  gpu[1-2]#x\r\n10.0.0.1 \t"
    assert parse_hosts(messy.encode("utf-8"), "f").hosts == parse_hosts(clean, "f").hosts


def test_duplicates_are_dropped_with_a_warning_naming_both_lines() -> None:
    hosts = parse_hosts("node01\nnode02\nNODE01 slots=4\nfe80::0:1\n[fe80::1]\nnode02\n", "h")
    assert [h.name for h in hosts] == ["node01", "node02", "fe80::0:1"]
    assert len(hosts.warnings) == 3
    first, second, third = hosts.warnings
    assert "h:3" in first and "h:1" in first and "slots" in first
    assert "h:5" in second and "h:4" in second
    assert "h:6" in third and "h:2" in third


def test_same_host_with_other_port_or_user_is_kept_with_a_telling_name() -> None:
    hosts = parse_hosts("node01\nu@node01:2222\nv@node01:2222\nnode02\n[fe80::1]:22\nfe80::1\n", "h")
    assert [h.name for h in hosts] == ["node01", "u@node01:2222", "v@node01:2222", "node02", "[fe80::1]:22",
                                       "fe80::1"]
    assert [h.name for h in parse_hosts("node01\nu@node01:2222\n", "h")] == ["node01", "node01:2222"]
    assert len({h.name for h in hosts}) == len(hosts)


REJECTED = [
    ("-oProxyCommand=touch /tmp/x", "start with '-'"),
    ("u@-oProxyCommand=x", "'-'"),
    ("node01 slots=$(id)", "metacharacter '$'"),
    ("`id`", "metacharacter '`'"),
    ("node01;reboot", "metacharacter ';'"),
    ("a|b", "metacharacter '|'"),
    ("a&&b", "metacharacter '&'"),
    ("{a,b}", "metacharacter '{'"),
    ("node\\01", "metacharacter"),
    ("n'1'", "metacharacter"),
    ("node 01", "cannot contain spaces"),
    ("node01 slots=0", "slots must be an integer from 1"),
    ("node01 slots=00", "slots must be"),
    ("node01 slots=-1", "slots must be"),
    ("node01 slots=eight", "slots must be"),
    ("node01:0", "slots must be"),
    ("node01:x", "host:N means N slots"),
    ("node01:8 slots=8", "slots given twice (host:N means N slots"),
    ("u@node01:0", "port must be an integer from 1 to 65535"),
    ("u@node01:65536", "port must be"),
    ("[node01]:http", "port must be"),
    ("node01 port=99999", "port must be"),
    ("u@node01:22 port=22", "port given twice"),
    ("u@node01 user=v", "user given twice"),
    ("node01 flavour=big", "unknown option 'flavour'"),
    ("node01 slots=1 slots=2", "given twice"),
    ("slots=8", "must start with a host"),
    ("@gpu", "groups"),
    ("u@@gpu", "groups"),
    ("gpu[1-", "malformed node list"),
    ("gpu[3-1]", "malformed node list"),
    ("gpu[a-b]", "malformed"),
    ("gpu[]", "malformed"),
    ("gpu[01-100]", "malformed node list"),
    ("[fe80::1", "expected [HOST]"),
    ("[fe80::1]22", "expected [HOST]"),
    ("fe80::zz", "not a valid IPv6"),
    ("999.1.1.1", "not a valid IPv4"),
    ("123", "not a valid IPv4"),
    ("bad-.host", "not a valid host name"),
    ("a..b", "not a valid host name"),
    ("x" * 64, "not a valid host name"),
    ("nöde01", "not a valid host name"),
    ("a/b", "not a valid host name"),
    ("a,,b", "empty entry"),
    ("bad!user@node01", "metacharacter"),
    ("-", "'-'"),
]


@pytest.mark.parametrize("line,reason", REJECTED, ids=[a[:30] for a, _ in REJECTED])
def test_every_rejection_names_source_line_and_text(line: str, reason: str) -> None:
    with pytest.raises(HostsError) as caught:
        parse_hosts(f"good01\n# fine\n{line}\ngood02\n", "hosts.txt")
    err = caught.value
    assert (err.source, err.line) == ("hosts.txt", 3)
    assert reason in err.reason
    assert str(err).startswith("hosts.txt:3: ")
    assert err.text and err.text in line and repr(err.text) in str(err)
    assert isinstance(err, InputError) and err.exit_code == 2


@pytest.mark.parametrize("raw,char", [(b"a\x00b", "U+0000"), (b"a\x1b[31mred", "U+001B"), (b"a\rb", "U+000D"),
                                      (b"ok # \x07", "U+0007"), ("a\x85".encode(), "U+0085")])
def test_control_characters_are_rejected_with_the_line(raw: bytes, char: str) -> None:
    with pytest.raises(HostsError, match=re.escape(f"f:2: control character {char}")):
        parse_hosts(b"good\n" + raw + b"\n", "f")


def test_bad_utf8_names_the_line() -> None:
    with pytest.raises(HostsError) as caught:
        parse_hosts(b"node01\nnode02\nn\xffde03\nnode04\n", "h.txt")
    assert (caught.value.line, caught.value.reason) == (3, "not valid UTF-8")
    assert "h.txt:3" in str(caught.value) and "\\xff" in caught.value.text


@pytest.mark.parametrize("text", ["", "\n\n", "# only\n  # comments\n\t\n", "\ufeff\r\n"])
def test_a_file_without_hosts_is_an_error(text: str) -> None:
    with pytest.raises(HostsError, match="^empty.txt: no hosts"):
        parse_hosts(text, "empty.txt")


def test_read_hosts_reads_files_and_names_bad_paths(tmp_path: Path) -> None:
    good = tmp_path / "hosts"
    good.write_bytes(b"node01\r\nnode02 slots=2\r\n")
    assert fields(read_hosts(str(good))) == [("node01", "node01", None, None, None),
                                             ("node02", "node02", None, None, 2)]
    assert read_hosts(str(good)).hosts[0].source == str(good)
    for path, reason in [(tmp_path / "missing", "no such file"), (tmp_path, "is a directory"),
                         (Path("/proc/self/mem"), "cannot read")]:
        with pytest.raises(HostsError) as caught:
            read_hosts(str(path))
        assert str(caught.value).startswith(f"{path}: ") and reason in str(caught.value)


def test_read_hosts_names_an_unreadable_file() -> None:
    """As root every file is readable, so a forked child drops to nobody and reads a 0600 root file."""
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o755)
        secret = Path(tmp, "hosts")
        secret.write_text("node01\n")
        secret.chmod(0o600)
        if os.geteuid() != 0:
            secret.chmod(0)
            with pytest.raises(HostsError, match="permission denied"):
                read_hosts(str(secret))
            return
        rfd, wfd = os.pipe()
        pid = os.fork()
        if pid == 0:  # child: never returns into pytest
            try:
                os.setgid(65534)
                os.setuid(65534)
                try:
                    read_hosts(str(secret))
                    msg = "read it"
                except HostsError as e:
                    msg = str(e)
                os.write(wfd, msg.encode())
            finally:
                os._exit(0)
        try:
            os.close(wfd)
            ready, _, _ = select.select([rfd], [], [], 30)
            assert ready, "child did not answer"
            assert os.read(rfd, 4096).decode() == f"{secret}: permission denied"
        finally:
            os.close(rfd)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.waitpid(pid, 0)


def test_stdin_is_read_for_dash() -> None:
    hosts = read_hosts("-", stdin=io.BytesIO(b"node01\nnode02:4\n"))
    assert fields(hosts) == [("node01", "node01", None, None, None), ("node02", "node02", None, None, 4)]
    assert {h.source for h in hosts} == {"<stdin>"}
    with pytest.raises(HostsError, match="^<stdin>:2: "):
        read_hosts("-", stdin=io.BytesIO(b"node01\n$(id)\n"))


def test_real_process_stdin_is_the_default() -> None:
    code = "from app.hosts import read_hosts; print([h.name for h in read_hosts('-')])"
    done = subprocess.run([sys.executable, "-c", code], input=b"a\nb # c\n", cwd=REPO, capture_output=True,
                          timeout=60, check=True)
    assert done.stdout.decode().strip() == "['a', 'b']"


def test_nodelist_argument() -> None:
    hosts = parse_nodelist("gpu[001-002],login1, u@gpu001:2222")
    assert fields(hosts) == [("gpu001", "gpu001", None, None, None), ("gpu002", "gpu002", None, None, None),
                             ("login1", "login1", None, None, None), ("gpu001:2222", "gpu001", "u", 2222, None)]
    assert {(h.source, h.line) for h in hosts} == {("-w", None)}
    for arg, reason in [("a b", "spaces"), ("-oProxyCommand=x", "'-'"), ("a,$(id)", "metacharacter"),
                        ("", "no hosts given"), ("a\nb", "control character"), ("@all", "groups")]:
        with pytest.raises(HostsError, match=f"^-w: .*{reason}"):
            parse_nodelist(arg)


def test_merge_dedupes_across_sources_and_keeps_order() -> None:
    file_hosts = parse_hosts("node01\nnode02\nnode01\n", "a.txt")
    merged = merge(file_hosts, parse_nodelist("node03,node02"), read_hosts("-", stdin=io.BytesIO(b"u@node03:22")))
    assert [(h.name, h.source) for h in merged] == [("node01", "a.txt"), ("node02", "a.txt"), ("node03", "-w"),
                                                    ("node03:22", "<stdin>")]
    assert merged.warnings[0] == file_hosts.warnings[0]
    assert merged.warnings[1] == "-w: node02 is listed again (first at a.txt:2); ignored"
    assert merge().hosts == ()
    with pytest.raises(InputError, match="--max-hosts"):
        merge(file_hosts, parse_nodelist("node03"), max_hosts=2)


def test_more_hosts_than_the_limit_says_how_many_and_how_to_raise_it() -> None:
    text = "\n".join(f"n{i}" for i in range(11))
    assert len(parse_hosts(text, "f", max_hosts=11)) == 11
    with pytest.raises(InputError) as caught:
        parse_hosts(text, "f", max_hosts=10)
    assert "f:11: more than 10 hosts" in str(caught.value) and "--max-hosts" in str(caught.value)
    assert len(parse_hosts("n1\n" * 50, "f", max_hosts=1)) == 1  # duplicates do not count


def test_a_huge_node_list_is_refused_before_it_is_expanded() -> None:
    # a billion names would take minutes and gigabytes to expand: finishing at all shows it was counted first
    with pytest.raises(InputError, match=r"n\[1-999999999\] expands to 999999999 hosts; the limit is 10000"):
        parse_hosts("n[1-999999999]\n", "f")
    with pytest.raises(InputError, match="expands to 20000 hosts"):
        parse_nodelist("n[1-100]x[1-200]")


def test_100000_lines_parse() -> None:
    text = "# generated\n" + "".join(f"node{i:06d} slots=8\n" if i % 2 else f"u@node{i:06d}:22\n"
                                     for i in range(100_000))
    started = time.process_time()
    hosts = parse_hosts(text.encode(), "big", max_hosts=100_000)
    print(f"100,000 lines: {time.process_time() - started:.2f} s CPU")
    assert len(hosts) == 100_000 and hosts.hosts[-1].line == 100_001
    with pytest.raises(InputError, match="more than 10000 hosts"):
        parse_hosts(text, "big")


INJECTIONS = [
    "-oProxyCommand=touch {m}", "-oProxyCommand=sh -c 'touch {m}'", "$(touch {m})", "`touch {m}`",
    "node01;touch {m}", "node01 && touch {m}", "node01|touch {m}", "node01 slots=$(touch {m})",
    "u@node01:22$(touch {m})", "node01\ntouch {m}\n", "{{a,b}}", "node01 >{m}", "-F{m}", "-E{m}",
]


@pytest.mark.parametrize("template", INJECTIONS)
def test_injection_strings_are_rejected_and_nothing_runs(template: str, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    tmp_x_before = os.path.exists("/tmp/x")
    for text in (template.format(m=marker), template.format(m="/tmp/x")):
        with pytest.raises(HostsError):
            parse_hosts(text, "evil")
        with pytest.raises(HostsError):
            parse_nodelist(text.replace(" ", ","))
    assert not marker.exists()
    assert tmp_x_before or not os.path.exists("/tmp/x")


_LABEL = r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,8}[A-Za-z0-9_])?"
names = st.from_regex(rf"{_LABEL}(\.{_LABEL}){{0,2}}", fullmatch=True).filter(
    lambda s: not s.replace(".", "").isdigit())
addresses = st.one_of(names, st.ip_addresses(v=4).map(str), st.ip_addresses(v=6).map(str))
specs = st.tuples(addresses, st.none() | st.from_regex(r"[a-z_][a-z0-9_.-]{0,8}", fullmatch=True),
                  st.none() | st.integers(1, 65535), st.none() | st.integers(1, 1024), st.integers(0, 2))


def render(host: str, user: str | None, port: int | None, slots: int | None, style: int) -> str:
    """Write one host in one of the accepted spellings: 0 all options, 1 user@host:port / host:slots, 2 [host]."""
    opts = [f"slots={slots}"] if slots else []
    if style == 0:
        return " ".join([host] + ([f"user={user}"] if user else []) + ([f"port={port}"] if port else []) + opts)
    bracket = style == 2 or ":" in host
    head = f"[{host}]" if bracket else host
    head = f"{user}@{head}" if user else head
    if port is not None and (user or bracket):
        head += f":{port}"
    elif port is not None:
        opts.append(f"port={port}")
    if slots and not (user or bracket):
        head += f":{slots}"  # host:N is slots
        opts.remove(f"slots={slots}")
    return "\t".join([head] + opts)


def identity(spec: tuple) -> tuple:
    try:
        host = str(ipaddress.ip_address(spec[0]))
    except ValueError:
        host = spec[0].lower()
    return (spec[1], host, spec[2])


@settings(max_examples=150, deadline=None)
@given(st.lists(specs, max_size=30, unique_by=identity))
def test_written_hosts_parse_back_in_order(hosts: list[tuple]) -> None:
    lines = [render(*h) + ("  # note" if i % 3 == 0 else "") for i, h in enumerate(hosts)]
    text = "# hosts\n\n" + "\r\n".join(lines)
    if not hosts:
        with pytest.raises(HostsError, match="no hosts"):
            parse_hosts(text, "gen")
        return
    parsed = parse_hosts(text, "gen")
    assert [(h.host, h.user, h.port, h.slots) for h in parsed] == [h[:4] for h in hosts]
    assert [h.line for h in parsed] == list(range(3, 3 + len(hosts)))
    assert len({h.name for h in parsed}) == len(parsed) and parsed.warnings == ()
