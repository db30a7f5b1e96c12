"""The relay's wire and node-side stage (app/transport/relay): framing both ways, routing by target, EOF and
kill, exit statuses, and the grouping/classification helpers. The stage runs for real as a subprocess, as
`python -c` from relay_stage; its ssh children go through a stand-in ssh client (named as such: it runs the
remote command here with sh; the live test, test_transport_relay.py, uses the nodes' real OpenSSH)."""

from __future__ import annotations

import asyncio
import shlex
import subprocess
import time

import pytest

import testenv
from app.transport.relay.framing import DOWN, FramingError, UpReader, down, down_to, relay_stage, up
from app.transport.relay.transport import RelayOptions, auto_width, groups, ssh_failure

pytestmark = pytest.mark.timeout(60)

# Stand-in worker: reads stdin to EOF, says who it is and what it got (reversed) on stdout, "bye" on stderr,
# exits 3. CHILD is set by the stand-in ssh (empty for the relay's own, local child).
ECHO = ("import os, sys; d = sys.stdin.buffer.read(); "
        "sys.stdout.buffer.write(os.environ.get('CHILD', 'local').encode() + b':' + d[::-1]); "
        "sys.stderr.write('bye'); sys.exit(3)")
# Stand-in ssh: `... -- HOST COMMAND`: runs COMMAND with sh here as HOST; host "down" fails as OpenSSH does
FAKE_SSH = ("import os, sys; a = sys.argv[1:]; i = a.index('--'); host, cmd = a[i + 1], a[i + 2]\n"
            "if host == 'down':\n"
            "    sys.stderr.write('ssh: connect to host down port 22: Connection refused\\r\\n'); sys.exit(255)\n"
            "os.environ['CHILD'] = host; os.execvp('sh', ['sh', '-c', cmd])")
SLEEPER = "import time, sys; sys.stdin.buffer.read(); time.sleep(60)"  # ignores EOF's meaning: must be killed


def _stage(children: list, worker: str = ECHO, grace: float = 10.0, parallel: int = 2,
           start_deadline: float = 5.0) -> list[str]:
    argv = [testenv.PYTHON, "-c", worker]
    # `exec`, as bootstrap.remote_command writes it: the worker is the process the stand-in ssh became
    code = relay_stage(7, argv, "exec " + " ".join(shlex.quote(a) for a in argv), children, connect_timeout=5,
                       grace=grace, parallel=parallel, start_deadline=start_deadline, ssh=[testenv.PYTHON, "-c", FAKE_SSH])
    return [testenv.PYTHON, "-c", code]


def _run(children: list, downward: bytes, **kw: object) -> dict[int, dict[str, bytes]]:
    done = subprocess.run(_stage(children, **kw), input=b"PAYLOAD" + downward, capture_output=True, timeout=30)
    assert done.returncode == 0, done.stderr
    got: dict[int, dict[str, bytes]] = {}
    reader = UpReader()
    for i in range(len(done.stdout)):  # one byte at a time: frames cut anywhere must come out whole
        for kind, child, data in reader.feed(done.stdout[i:i + 1]):
            got.setdefault(child, {}).setdefault(kind, b"")
            got[child][kind] += data
    assert not reader.buf
    return got


def test_stage_gives_each_child_the_payload_and_its_own_frames_and_frames_their_streams() -> None:
    got = _run([None, ["node02", None, None], ["node03", 2222, "me"]],
               down(b"*", "D", b"+all") + down(b"1", "D", b"+one") + down(b"0,2", "D", b"+zt")
               + down(b"*", "E"))
    assert got[0] == {"O": b"local:" + b"PAYLOAD+all+zt"[::-1], "E": b"bye", "X": b"3"}
    assert got[1] == {"O": b"node02:" + b"PAYLOAD+all+one"[::-1], "E": b"bye", "X": b"3"}
    assert got[2]["O"] == b"node03:" + b"PAYLOAD+all+zt"[::-1] and got[2]["X"] == b"3"


def test_an_unreachable_child_exits_255_with_ssh_s_words_and_the_others_run() -> None:
    # one start slot (parallel=1 is not what runs, but it shows the rule): a child that fails without a word
    # on stdout frees its slot when it exits, not at the start deadline (60 s here)
    t0 = time.monotonic()
    got = _run([None, ["down", None, None], ["node03", None, None]], down(b"*", "E"), parallel=1,
               start_deadline=60.0)
    assert time.monotonic() - t0 < 20
    assert got[1]["X"] == b"255" and b"Connection refused" in got[1]["E"] and "O" not in got[1]
    assert got[0]["X"] == got[2]["X"] == b"3"
    assert ssh_failure(got[1]["E"].decode())[:2] == ("refused", "connect")


def test_kill_and_the_end_of_the_relays_stdin_end_every_child() -> None:
    # K to child 1 (kill after the grace); then the relay's stdin ends: EOF and kill for every child. The
    # sleepers would sleep 60 s: the relay must be done long before.
    t0 = time.monotonic()
    got = _run([None, ["node02", None, None]], down(b"1", "K"), worker=SLEEPER, grace=0.5)
    assert time.monotonic() - t0 < 15
    assert got[0]["X"] == got[1]["X"] == b"-9"


def test_frames_and_targets() -> None:
    assert down_to([3], 8, "D", b"x") == DOWN.pack(ord("D"), 1, 1) + b"3x"
    assert down_to([0, 1, 2], 3, "E") == DOWN.pack(ord("E"), 1, 0) + b"*"
    assert down_to([0, 1, 2, 5], 8, "D", b"") == DOWN.pack(ord("D"), 5, 0) + b"0-2,5"
    reader = UpReader()
    assert list(reader.feed(up("O", 7, b"ab") + up("X", 65535, b"0")[:5])) == [("O", 7, b"ab")]
    assert list(reader.feed(up("X", 65535, b"0")[5:])) == [("X", 65535, b"0")]
    with pytest.raises(FramingError):
        list(UpReader().feed(b"Last login: Mon\n"))  # a login shell's chatter is not a frame


def test_grouping_and_width() -> None:
    for n, w in ((6, 3), (200, 15), (201, 15), (7, 64), (12500, 112)):
        parts = groups(n, w)
        assert [i for g in parts for i in g] == list(range(n))
        assert max(map(len, parts)) - min(map(len, parts)) <= 1 and max(map(len, parts)) <= w
    assert (auto_width(200), auto_width(12500), auto_width(4)) == (15, 112, 8)
    assert RelayOptions.from_flag("off") is None and RelayOptions.from_flag("5") == RelayOptions(width=5, threshold=2)
    with pytest.raises(ValueError):
        RelayOptions.from_flag("1")


@pytest.mark.parametrize("stderr, code", [
    ("ssh: connect to host n port 22: No route to host", "unreachable"),
    ("ssh: connect to host n port 22: Connection timed out", "connect_timeout"),
    ("ssh: Could not resolve hostname n: Name or service not known", "dns"),
    ("root@n: Permission denied (publickey).", "auth_failed"),
    ("No ED25519 host key is known for n and you have requested strict checking.\r\nHost key verification failed.",
     "host_key_unknown"),
    ("@@@ WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED! @@@\nHost key verification failed.", "host_key_changed"),
    ("something else entirely", "ssh_error"),
])
def test_ssh_failures_get_the_codes_a_direct_connection_gives(stderr: str, code: str) -> None:
    assert ssh_failure(stderr)[0] == code


async def test_a_request_every_child_shares_goes_down_once_and_order_per_child_holds() -> None:
    from app.hosts import HostSpec
    from app.transport.relay.transport import Relay

    relay = Relay(None, [HostSpec(name=n, host=n) for n in ("a", "b", "c")])  # type: ignore[arg-type]
    for chan in relay.channels:
        chan.write(b"REQ")  # one loop turn: the same request to every child
    relay.channels[1].write(b"more")
    relay.channels[2].write_eof()
    await asyncio.sleep(0)
    assert relay._early == [down(b"*", "D", b"REQ"), down(b"1", "D", b"more"), down(b"2", "E")]
    relay.channels[0].write(b"x")
    relay.channels[0].write(b"y")  # a second frame for one child in the same turn keeps its order
    relay.channels[2].kill()
    await asyncio.sleep(0)
    assert relay._early[3:] == [down(b"0", "D", b"x"), down(b"0", "D", b"y"), down(b"2", "K")]


def test_the_stage_is_python_3_9_and_stdlib_only() -> None:
    import ast
    import sys

    from app.transport.relay.framing import STAGE_SOURCE

    tree = ast.parse(STAGE_SOURCE.read_text(encoding="ascii"), feature_version=(3, 9))
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported and imported <= set(sys.stdlib_module_names), imported


async def test_opens_cancelled_while_their_relay_connects_still_let_it_end() -> None:
    from app.hosts import HostSpec
    from app.transport.relay.transport import RelayTransport
    from app.transport.ssh import SshOptions

    class NeverConnects:  # a stand-in SSH transport whose relay connection never comes up
        options = SshOptions()

        async def start_command(self, *a: object, **kw: object) -> None:
            await asyncio.sleep(3600)

    t = RelayTransport(NeverConnects(), RelayOptions(width=3, threshold=2))  # type: ignore[arg-type]
    opens = [asyncio.create_task(t.open(HostSpec(name=n, host=n))) for n in ("a", "b", "c")]
    await asyncio.sleep(0.2)  # past the batch window: the relay is connecting
    assert len(t.relays) == 1 and not t.relays[0].ready.done()
    for task in opens:
        task.cancel()
    await asyncio.gather(*opens, return_exceptions=True)
    relay = t.relays[0]
    assert all(c.closed for c in relay.channels) and relay.stopping is not None  # it stops once it is up
    relay.stopping.cancel()
    for task in asyncio.all_tasks() - {asyncio.current_task()}:
        task.cancel()
