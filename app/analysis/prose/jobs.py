"""Sentences for facts about the job as a whole: ranks launched with other flags, launchers without ranks, ranks
not found, nodes not inspected, addresses outside the hosts list, stalled sockets, the Flight Recorder's
sequence numbers, thread counts, dumps that failed, several jobs in one snapshot, nothing to analyse."""

from __future__ import annotations

from typing import Tuple

from app.analysis.facts import Fact
from app.analysis.frames import clean
from app.analysis.launch import LaunchEvidence
from app.analysis.prose.words import who_label, who_short

Text = Tuple[str, str, str]
MAX_KEYS = 4  # differing flags named in one sentence


def flag_value(v: str) -> str:
    return "unset" if v == "(not given)" else ("set" if v == "(set)" else f"`{clean(v, 60)}`")


def flags_shown(e: LaunchEvidence) -> str:
    shown = ", ".join(f"{clean(k, 60)} {flag_value(mine)} where the others have {flag_value(theirs)}"
                      for k, mine, theirs in e.diff[:MAX_KEYS])
    more = f" and {len(e.diff) - MAX_KEYS} more" if len(e.diff) > MAX_KEYS else ""
    return shown + more


def launch_text(f: Fact) -> Text:
    e = f.data
    assert isinstance(e, LaunchEvidence)
    label = who_label(f.who)
    shown = flags_shown(e)
    n = len(e.diff)
    return (clean(f"{label} run with other flags than the other {e.total - len(f.who.keys)} ranks: {shown}", 300),
            f"command lines differ in {n} flag{'s' if n != 1 else ''}: {shown}. Ranks launched with other training "
            "settings (accumulation steps, batch size, model options) issue another number or order of collectives, "
            "and the job hangs where they part: launch every node with the same flags.",
            "the same job's ranks normally run one command line; these few run another" if e.few else
            "many ranks differ: the launch may set some flags per node on purpose")


def store_text(f: Fact) -> Text:
    from app.analysis.launch import StoreEvidence

    e = f.data
    assert isinstance(e, StoreEvidence)
    n = len(f.who.keys)
    who = f"all {n} ranks" if n == e.total and n > 1 else who_label(f.who)
    if e.connected:
        by = f", where {clean(e.holder, 160)} listens" if e.holder else ""
        title = (f"{who} joined the store at {clean(e.connect, 120)}{by}, not their job's at {clean(e.given, 120)} "
                 f"where the other {e.total - n} ranks are: {'it waits' if n == 1 else 'they wait'} in "
                 "`init_process_group` for peers that never come there, and the others wait for "
                 f"{'it' if n == 1 else 'them'}")
        detail = ("their environment as started gives the job's store, and every other rank is connected there; these "
                  "hold a connection to another address instead: something in the process set another MASTER_ADDR or "
                  "MASTER_PORT (an env file it reads, a config value, an init_method URL)"
                  + (f", and {clean(e.holder, 160)} answers there: a store left by an earlier run, or another job's"
                     if e.holder else ""))
        return (clean(title, 400), detail, "the ranks' own connections: one address for the job, another for these")
    title = (f"{who} retry connecting to the job's store at {clean(e.connect, 120)} in `init_process_group`, where "
             f"nothing accepts: their launcher's store is at {clean(e.given, 120)} (MASTER_ADDR:MASTER_PORT in the "
             "environment it started them with)")
    detail = ("the call's own arguments name the address it connects to, and no rank holds a connection there"
              + ("; a rank sleeps between attempts, so none was accepted" if e.retrying else "") + ". Something in the job set another MASTER_PORT or MASTER_ADDR (os.environ before "
              "init_process_group, a config value, an init_method URL) than the launcher's; under torchrun the ranks "
              "are clients of its agent's store, and no process serves the other address: they retry until the "
              "timeout")
    return (clean(title, 400), detail,
            "every rank waits to connect to one address, and it is not the one their environment gives")


def outside_text(f: Fact) -> Text:
    from app.analysis.fold import fold_ints, fold_nodes
    from app.analysis.peers import MAX_PEERS, OutsideEvidence

    e = f.data
    assert isinstance(e, OutsideEvidence)
    peers = e.peers
    shown = peers[:MAX_PEERS]
    where = ", ".join(p.text() for p in shown) + (f" and {len(peers) - len(shown)} more" if len(peers) > len(shown)
                                                  else "")
    numbers = list(e.numbers)
    who = (f"rank{'s' if len(numbers) != 1 else ''} {fold_ints(numbers)}" if numbers
           else f"{len(e.holders)} process{'es' if len(e.holders) != 1 else ''}")
    hold = (f"{who} on {fold_nodes(k[0] for k in e.holders)} hold {e.connections} "
            f"connection{'s' if e.connections != 1 else ''}")
    named = [p for p in shown if p.name]
    how = "; ".join(f"{clean(p.address, 60)} is {clean(p.name, 80)} by the {p.how}" for p in named)
    add = fold_nodes(p.name for p in named) if named and len(named) == len(shown) else ""
    hint = (f"add {add} to the hosts list" if add else
            "add the node(s) at these addresses to the hosts list (`getent hosts ADDRESS` names them)")
    if e.missing is not None:
        label, job = e.missing_label, e.job
        one = label.startswith("rank ")
        title = f"{label} {'is' if one else 'are'} not in the snapshot: the job runs on {where} too, which the hosts " \
            "list leaves out"
        detail = (f"{hold} to {where}, which no inspected node has: that is where {label} run{'s' if one else ''}, "
                  f"and the inspected ranks wait for them. {hint[:1].upper() + hint[1:]} to see what they do{job}.")
        reason = ("ranks are missing and the inspected ranks talk to addresses no inspected node has; which of the "
                  "missing ranks holds the others up is not known")
    else:
        title = f"the job's ranks talk to {where}, which the hosts list leaves out"
        detail = (f"{hold} to {where}, which no inspected node has: if the job runs there too, {hint} "
                  f"(every rank was found, so this may also be a service the ranks use).")
        reason = "every expected rank was found; the address may be a service, not a node of the job"
    if how:
        detail += f" Names: {how}."
    return clean(title, 300), detail, reason


def network_text(f: Fact) -> Text:
    from app.analysis.fold import fold_nodes
    from app.analysis.network import MAX_EVIDENCE, NetworkEvidence, host_of

    e = f.data
    assert isinstance(e, NetworkEvidence)
    stalls = e.stalls
    evidence = "; ".join(s.text() for s in stalls[:MAX_EVIDENCE])
    if len(stalls) > MAX_EVIDENCE:
        evidence += f"; and {len(stalls) - MAX_EVIDENCE} more"
    suspect = e.suspect[0]
    if e.shape == "outgoing":
        peers = fold_nodes({s.peer_node or host_of(s.peer) for s in stalls})
        title = f"{suspect}'s sockets to {peers} stall: {suspect} (or its link) has lost the network"
    elif e.shape == "incoming":
        title = f"sockets on {fold_nodes({s.node for s in stalls})} towards {suspect} stall: {suspect} (or the path " \
            "to it) does not answer"
    elif e.shape == "involves":
        title = f"every stalled socket involves {suspect}: {suspect} (or its link) is the problem"
    elif e.shape == "link":
        title = f"the link between {e.suspect[0]} and {e.suspect[1]} stalls"
    else:
        title = f"sockets stall on {fold_nodes(e.nodes)}; {suspect} is involved most ({e.top_count} of {len(stalls)})"
    reason = {"silent": "no retransmissions, only a peer that has been silent much longer than the others",
              "same_place": "every rank waits at the same place and the stalled sockets all lead to one place",
              "same_stack": "every rank waits on the same line, and every stalled socket retransmits towards one node",
              "one_place": "the stalled sockets lead to one place", "single": "a single stalled socket",
              "spread": "stalls are spread over several nodes"}[e.case]
    if e.unacked_only:
        reason += "; the evidence is unacknowledged bytes only"
    return clean(title, 300), f"evidence: {evidence}.", reason


def _numbers(ranks: tuple) -> str:
    from app.analysis.fold import fold_ints

    known = sorted(r for r in ranks if r is not None)
    return f"rank {known[0]}" if len(known) == 1 else f"ranks {fold_ints(known)}"


def _code(name: str) -> str:
    return f"`{clean(name, 60)}`" if name else "another collective"


def flight_text(f: Fact) -> Text:
    from app.analysis.flight import FlightEvidence
    from app.analysis.fold import count_phrase

    e = f.data
    assert isinstance(e, FlightEvidence)
    n = len(f.who.keys)
    names = dict(e.names)
    pg = clean(e.pg, 40)
    op = f" ({clean(names[e.pg], 60)})" if e.pg in names else ""
    if e.stage == "started":
        title = (f"{who_short(f.who)}'{'' if who_short(f.who).endswith('s') else 's'} GPU"
                 f"{'' if n == 1 else 's'} {'has' if n == 1 else 'have'} not started collective #{e.usual} of "
                 f"process group {pg}{op}, which the GPU{'' if e.others == 1 else 's'} of "
                 f"{count_phrase(e.others, 'other')} started")
        detail = (f"Flight recorder (start times on): every rank issued #{e.usual}; the GPUs of "
                  f"{count_phrase(e.others, 'other')} began it and wait in it for "
                  f"{'this rank' if n == 1 else 'these ranks'}, whose GPU still runs work queued before the "
                  "collective (a kernel that does not end, a wait on another stream or an event). The hosts wait "
                  "alike (in the synchronisation): only the GPU side tells the ranks apart")
        if n * 3 <= e.others:
            reason = "the recorder's start marks put these few ranks' GPUs behind the rest"
        else:
            reason = "the recorder's start marks differ between groups of similar size"
        return title, detail + ".", reason
    if e.stage == "ahead":
        title = (f"{who_short(f.who)} {'is' if n == 1 else 'are'} ahead in process group {pg}: "
                 f"{'it' if n == 1 else 'they'} issued collective #{e.issued}{op}, which "
                 f"{count_phrase(e.others, 'other')} {'has' if e.others == 1 else 'have'} not (at #{e.usual})")
        detail = (f"Flight recorder: ahead in pg {pg}: #{e.issued} vs #{e.usual}. A rank ahead of the rest issued "
                  "a collective the others have not, and waits in it: either one they will never issue (an extra "
                  "collective on a branch only it takes: logging, a metric, a check on rank 0) or one they reach "
                  "later, when something holds them before it (their stacks say where)")
        return title, detail + ".", "a few ranks ahead of the rest: they issued one too many, or the rest is held"
    if e.stage == "crossed":
        a, b = (_numbers(side) for side in e.sides)
        (ga, va, wb), (gb, vb, wa) = e.devs[0], e.devs[1]
        title = (f"{a} and {b} call the collectives of process groups {clean(ga, 60)} and {clean(gb, 60)} in "
                 f"opposite orders: {a} waits in {clean(gb, 60)}'s #{wa}, which {b} has not issued, and {b} in "
                 f"{clean(ga, 60)}'s #{wb}, which {a} has not issued")
        detail = (f"Flight recorder: {a} is at #{va} in {clean(ga, 60)}, where {b} waits in #{wb}; {b} is at #{vb} in "
                  f"{clean(gb, 60)}, where {a} waits in #{wa}: each side waits for the other (a cycle). The records "
                  "do not say which order was meant")
        return title, detail + ".", "their own records put each side in the collective the other has not issued"
    if e.stage == "op":
        theirs = names.get(e.pg, "")
        title = (f"{who_short(f.who)} issued {_code(e.op)} as collective #{e.usual} of process group {pg}, where "
                 f"{count_phrase(e.others, 'other')} issued {_code(theirs)}")
        detail = (f"Flight recorder: in pg {pg}, every rank issued #{e.usual}, but not the same collective: "
                  f"{_code(e.op)} here, {_code(theirs)} there. Collectives that do not match never complete: each "
                  "side waits for the other (a swapped pair, a barrier where the others reduce, a collective on a "
                  "branch)")
        reason = ("the recorder names the collective each rank issued at that number"
                  if n * 3 <= e.others else "the collectives differ between groups of similar size")
        return title, detail + ".", reason
    title = (f"{who_short(f.who)} {'is' if n == 1 else 'are'} behind in process group {pg}: last "
             f"collective issued #{e.issued} where {count_phrase(e.others, 'other')} "
             f"{'is' if e.others == 1 else 'are'} at #{e.usual}")
    if e.elsewhere:
        there, seq, name = e.elsewhere[0]
        title += (f", and {'waits' if n == 1 else 'wait'} in process group {clean(there, 40)}'s collective #{seq}"
                  + (f" ({clean(name, 60)})" if name else "") + " instead, which no other rank has issued")
    parts = [f"{'behind' if v < u else 'ahead'} in pg {clean(p, 40)}: #{v} vs #{u}"
             + (f" ({clean(names[p], 60)})" if p in names else "") for p, v, u in e.devs]
    detail = ("Flight recorder: " + "; ".join(parts) + ". A rank behind in a group has not issued the "
              "collective the others of the group wait in")
    if e.elsewhere:
        there = clean(e.elsewhere[0][0], 40)
        rest = e.records - n
        detail += (f". It issued one of process group {there} that {'no' if rest == 1 else 'none of the'} "
                   f"{rest} other record{'' if rest == 1 else 's'} read hold{'s' if rest == 1 else ''}: the ranks call "
                   f"collectives of different groups, and the members of group {there} that wait in group {pg} "
                   "are the ones it waits for (a cycle)")
    if e.elsewhere and f.strength == "high":
        reason = (f"{'its' if n == 1 else 'their'} own record puts {'it' if n == 1 else 'them'} in a collective "
                  f"no other rank issued ({e.records} records read: every rank's)")
    elif n == e.others:
        reason = "as many ranks are behind as ahead: either side may be the odd one"
    elif n * 3 <= e.others:
        reason = "the recorder's own sequence numbers put these few ranks behind the rest"
    else:
        reason = "the recorder's sequence numbers differ between groups of similar size"
    return title, detail + ".", reason


def launchers_text(f: Fact) -> Text:
    from app.analysis.fold import fold_ints, fold_nodes
    from app.analysis.processes import LaunchersEvidence, doing

    e = f.data
    assert isinstance(e, LaunchersEvidence)
    procs = e.launchers
    job = clean(e.job or "unidentified", 120)
    nodes = sorted({p.node for p in procs})
    if f.kind == "launch_incomplete":
        if e.absent:
            missing = f"node rank{'s' if len(e.absent) != 1 else ''} {fold_ints(e.absent)}"
        else:
            extra = (e.nnodes or 0) - len(nodes)
            missing = f"{extra} more node{'s' if extra != 1 else ''}"
        where = f" ({fold_nodes(e.idle_nodes)}, in the hosts list, runs no launcher of the job)" if e.idle_nodes else ""
        title = (f"job {job} never started: its launchers were told --nnodes {e.nnodes} and run as node rank"
                 f"{'s' if len(e.node_ranks) != 1 else ''} {fold_ints(e.node_ranks)}, so the rendezvous waits for "
                 f"{missing}{where}, whose launcher is not running")
        detail = (f"{len(procs)} launcher{'s' if len(procs) != 1 else ''} on {fold_nodes(nodes)} wait in the "
                  f"rendezvous{' at ' + clean(e.rendezvous, 80) if e.rendezvous else ''} for every node rank of "
                  f"0..{(e.nnodes or 1) - 1} to join; no launcher says it is {missing}. Start the launcher there (with "
                  f"--node-rank {fold_ints(e.absent) if e.absent else 'N'} and the same rendezvous), or check why it "
                  "exited (the scheduler's log for that node, its output); the job's ranks start once every node has "
                  "joined")
        return (clean(title, 400), detail,
                "the launchers' own --nnodes and --node-rank say which node rank has not joined" +
                ("" if e.absent else "; which node rank is missing is not said (no --node-rank)"))
    where = "; ".join(f"{p.kind} pid {p.pid} on {p.node}" + (f" {doing(p)}" if doing(p) else "") for p in procs[:4])
    more = f" and {len(procs) - 4} more" if len(procs) > 4 else ""
    return (clean(f"job {job} has {len(procs)} launcher{'s' if len(procs) != 1 else ''} on {', '.join(nodes[:4])}"
                  f"{'...' if len(nodes) > 4 else ''} and no rank yet", 300),
            clean(where + more, 600),
            "no rank process exists while its launchers run: a launcher waiting in its rendezvous waits for nodes "
            "(or a store) that have not joined; check that every node of the job started its launcher and can "
            "reach the rendezvous endpoint")


def launcher_held_text(f: Fact) -> Text:
    from app.analysis.fold import fold_nodes
    from app.analysis.processes import HeldLauncherEvidence

    e = f.data
    assert isinstance(e, HeldLauncherEvidence)
    p = e.launcher
    how = "stopped (SIGSTOP or job control)" if e.how == "stopped" else "stopped by a tracer"
    at = f" at {clean(e.rendezvous, 80)}" if e.rendezvous else ""
    nodes = sorted({q.node for q in e.waiting})
    waiting = (f"; {len(e.waiting)} launcher{'s' if len(e.waiting) != 1 else ''} on {fold_nodes(nodes)} wait in the "
               f"rendezvous{at} for it" if e.waiting else "")
    title = f"the launcher on {p.node} ({p.kind} pid {p.pid}) is {how} while its job has no rank yet{waiting}"
    detail = (f"job {e.job or 'unidentified'}: a rendezvous round (torchrun's agents, meeting through the job's "
              "store) completes only when every node's launcher takes part; a stopped one does not, so no rank "
              "starts on any node. hangscope left it as it was")
    return (clean(title, 400), clean(detail, 400),
            f"the kernel reports the launcher {e.how} (state {'T' if e.how == 'stopped' else 't'}), and no rank "
            "of its job exists yet")


def rendezvous_text(f: Fact) -> Text:
    from app.analysis.processes import RendezvousEvidence

    e = f.data
    assert isinstance(e, RendezvousEvidence)
    p = e.launcher
    flags = ", ".join(f"{k} {clean(mine, 60)} where the others have {clean(theirs, 60)}" for k, mine, theirs in e.diff[:3])
    title = (f"the launcher on {p.node} ({p.kind} pid {p.pid}) was started with {flags}: it waits in a rendezvous "
             f"of its own, and the {e.others} other launchers wait for a node that never joins theirs")
    detail = (f"job {e.job or 'unidentified'}: a launcher joins the rendezvous its flags name (--rdzv-endpoint, "
              "--rdzv-id, --rdzv-backend, --nnodes; --master-addr and --master-port for a static one); one started "
              "with another value meets no one, and no rank starts anywhere")
    return (clean(title, 400), clean(detail, 400),
            "the launchers' own command lines differ in the flags that name their rendezvous")


def no_data_text(f: Fact) -> Text:
    from app.analysis.processes import NoDataEvidence

    e = f.data
    assert isinstance(e, NoDataEvidence)
    if not e.ranks:
        why = f"; {e.failed} of {e.nodes} nodes failed" if e.failed else ""
        return (f"no rank processes were found{why}",
                "hangscope looks for processes with RANK/LOCAL_RANK in their environment and for multiprocessing "
                "spawn children with torch loaded; check the hosts list, that the job runs as a user whose processes "
                "you can read, and the nodes' notes, which list python processes with torch loaded: pick ranks with "
                "--match REGEX (their command line, on every node) or --pid", "nothing to analyse")
    return (f"no stacks were collected from any of the {e.ranks} ranks", "see why in the dump failures above",
            "nothing to merge")
