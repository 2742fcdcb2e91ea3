"""The attach listener under a hostile network: how long two real ranks (torchrun nodes on this machine,
`launcher="torchrun"`) take to attach with 50 silent and 50 trickling (a byte every 2 s) connections held
open against the listener, each reopened when the listener drops it; with a flood of fresh connections
(one process opening them as fast as it can, from the ranks' own host: the listener can tell them apart
from the ranks only by their age); against the same start with no attackers, interleaved.

`--netns` adds two hosts (root; `bench/_netns.py`): the listener in the root namespace on 10.77.0.1, the
two torchrun nodes (the printed `%dist attach` command, `Cluster.attach`) in a namespace "node" (10.77.0.2,
rendezvous and gloo on its own loopback), quiet; with the flood from a third namespace (another host:
eviction by host must keep the ranks' handshakes); and with the flood from the ranks' own namespace (the
hard case: a rank whose handshake was closed connects again until its --connect-timeout of 60 s).
Without root or `ip` these modes are skipped with one line. The namespaces, veths and everything started
in them are removed at the end, on Ctrl-C and on SIGTERM.

Measured 2026-11-27 on the 2-core sandbox (shared, 1-min load 1.3-4.8), 3 repeats each, median (min-max);
every start attached:
  loopback: quiet 3.45 s (2.99-5.38); 50 silent + 50 trickling 3.11 s (2.93-3.74), ratio 0.90; flood
    (40,000-76,000 connections/s) 13.07 s (11.63-17.30), ratio 3.79.
  two hosts: quiet 3.94 s (2.91-3.96); flood from a third host (27,000-82,000/s) 8.72 s (7.95-47.73),
    ratio 2.21; flood from the ranks' own host (36,000-57,000/s) 12.23 s (5.09-13.10), ratio 3.10.
  two hosts again (`--only-netns`, load 2.3-4.2): quiet 5.35 s (4.00-5.40); from a third host (29,000-
    65,000/s) 7.64 s (7.44-8.27), ratio 1.43; from the ranks' own host (29,000-77,000/s) 12.79 s
    (8.91-47.33), ratio 2.39.
The flood takes one of the two cores. In the two 47 s starts (1 in 6 of each flooded case) one rank came
about 45 s after the other; why is not established (the node logs were not kept).
Before the namespaces got a resolver that answers (`_netns.py`), each two-host start took 20 s more:
torch's c10d store waits 10 s on a peer's reverse lookup when no DNS server is reachable.

    python bench/bench_attach_hostile.py [--repeats 3] [--silent 50] [--trickling 50] [--no-flood]
                                         [--netns | --only-netns]
"""
from __future__ import annotations

import argparse
import os
import selectors
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from kit import Cluster, LaunchConfig, attach_command
from kit.errors import WorkerStartError

from _netns import LISTENER, Hosts, unavailable  # bench/ is the script's directory, first on sys.path

ATTACH_TIMEOUT_S = 90  # the ranks give up after their --connect-timeout (60 s): a lost case ends here

QUIET = lambda *a: None  # noqa: E731


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def attack(port: int, silent: int, trickling: int, stop: threading.Event, stats: dict[str, int]) -> None:
    """Keep `silent` + `trickling` connections open; a trickling one sends a byte every 2 s."""
    sel = selectors.DefaultSelector()
    kinds: dict[socket.socket, str] = {}
    last_trickle = 0.0
    while not stop.is_set():
        for kind, want in (("silent", silent), ("trickling", trickling)):
            while sum(1 for k in kinds.values() if k == kind) < want and not stop.is_set():
                try:
                    s = socket.create_connection(("127.0.0.1", port), timeout=1)
                except OSError:
                    time.sleep(0.05)
                    break
                s.setblocking(False)
                kinds[s] = kind
                sel.register(s, selectors.EVENT_READ)
                stats["opened"] += 1
        stats["open_now"] = len(kinds)
        for key, _ in sel.select(0.1):  # the greeting, then end of file once the listener drops us
            s = key.fileobj
            try:
                data = s.recv(4096)  # type: ignore[union-attr]
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:
                sel.unregister(s)
                kinds.pop(s)  # type: ignore[arg-type]
                s.close()  # type: ignore[union-attr]
        if time.monotonic() - last_trickle >= 2.0:
            last_trickle = time.monotonic()
            for s, kind in kinds.items():
                if kind == "trickling":
                    try:
                        s.send(b"x")
                    except OSError:
                        pass
    for s in kinds:
        s.close()
    sel.close()


FLOOD = """
import collections, os, socket, struct, sys, time
held, opened, t0, parent = collections.deque(), 0, time.monotonic(), os.getppid()
# Ends by itself after 300 s or once the bench is gone; closes with a reset so that the closed connections'
# ports do not sit in TIME_WAIT (20,000 a second exhaust the ephemeral range every later bind(0) needs).
while time.monotonic() - t0 < 300 and (opened % 256 or os.getppid() == parent):
    s = socket.socket()
    s.setblocking(False)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.connect_ex((sys.argv[2], int(sys.argv[1])))
    held.append(s)
    opened += 1
    if len(held) > 600:
        held.popleft().close()
    if opened % 2000 == 0:
        print(round(opened / (time.monotonic() - t0)), flush=True)
"""


def start_time(mode: str, args: argparse.Namespace, key_file: str) -> tuple[float, str]:
    port = _free_port()
    stop, stats = threading.Event(), {"opened": 0}
    t = threading.Thread(target=attack, args=(port, args.silent, args.trickling, stop, stats), daemon=True)
    if mode == "hostile":  # the attackers connect as soon as the listener opens, seconds before the nodes do
        t.start()
    floods: list[subprocess.Popen] = []
    starter = threading.Timer(0.3, lambda: floods.append(subprocess.Popen(
        [sys.executable, "-c", FLOOD, str(port), "127.0.0.1"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        text=True, start_new_session=True)))
    if mode == "flood":  # started once the listener is up (a connect to a closed port may take it over)
        starter.start()
    t0 = time.perf_counter()
    try:
        c = Cluster(LaunchConfig(world_size=2, launcher="torchrun", port=port, key_file=key_file,
                                 start_timeout_s=120)).start()
    except BaseException:
        stop.set()
        starter.cancel()  # a start that failed first must not leave a flood running after the bench
        if starter.is_alive():
            starter.join()
        for flood in floods:
            _stop_flood(flood)
        raise
    took_s = time.perf_counter() - t0
    if starter.is_alive():
        starter.join()
    said = f" ({stats.get('open_now', 0)} attacker connections open when the ranks were in, {stats['opened']} " \
           f"opened in all)" if mode == "hostile" else ""
    try:
        assert c.run("t = torch.ones(1)\ndist.all_reduce(t)\nt.item()", on_output=QUIET).values == {0: 2.0, 1: 2.0}
    finally:
        c.shutdown()
        stop.set()
        if mode == "hostile":
            t.join(timeout=10)
        for flood in floods:
            said = f" ({_stop_flood(flood)})"
    return took_s, said


def _stop_flood(flood: subprocess.Popen) -> str:
    """Kill the flood's process group; the connections per second it reached, as it printed them."""
    os.killpg(flood.pid, signal.SIGKILL)
    rates = flood.communicate(timeout=10)[0].split()
    return f"the flood opened {rates[-1] if rates else '<2000 in all, under'} connections/s"


SLOW_S = 15.0  # a flooded two-host start slower than this shows the nodes' [kit] lines


def netns_time(mode: str, hosts: Hosts, key_file: str) -> tuple[float | None, str]:
    """Two torchrun nodes in the namespace "node" attach to the listener on 10.77.0.1 (root namespace):
    quiet, with the flood from the third namespace (another host), or from the ranks' own namespace."""
    port = _free_port()
    command = attach_command(LISTENER, port, key_file, 2, 1, f"127.0.0.1:{_free_port()}").split()
    node_argv = hosts.exec_argv(hosts.node) + [sys.executable, "-m", "torch.distributed.run"] + command[1:]
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    flood_ns = {"ns-flood-other": hosts.other, "ns-flood-node": hosts.node}.get(mode)
    floods: list[subprocess.Popen] = []
    starter = threading.Timer(0.3, lambda: floods.append(subprocess.Popen(
        hosts.exec_argv(flood_ns) + [sys.executable, "-c", FLOOD, str(port), LISTENER], stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, text=True, start_new_session=True)))
    nodes: list[subprocess.Popen] = []
    logs = [tempfile.TemporaryFile("w+") for _ in range(2)]  # the nodes' stderr: shown for a slow start
    c, said, took_s = None, "", None
    t0 = time.perf_counter()
    try:
        nodes = [subprocess.Popen(node_argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=log, start_new_session=True) for log in logs]
        if flood_ns:  # once the listener is up, as on loopback
            starter.start()
        try:
            c = Cluster.attach(2, host=LISTENER, port=port, key_file=key_file, timeout_s=ATTACH_TIMEOUT_S)
            took_s = time.perf_counter() - t0
        except WorkerStartError as e:  # the hard case may lose: say so, do not stop the other repeats
            took_s, said = None, f" (not attached: {str(e).splitlines()[0][:160]})"
        if c is not None:
            assert c.run("t = torch.ones(1)\ndist.all_reduce(t)\nt.item()", on_output=QUIET).values == \
                {0: 2.0, 1: 2.0}
    finally:
        starter.cancel()  # a start that failed first must not leave a flood running after the bench
        if starter.is_alive():
            starter.join()
        for flood in floods:
            said += f" ({_stop_flood(flood)})"
        if c is not None:
            c.shutdown()
        for node in nodes:  # torchrun agents lead their own sessions (what is left inside: Hosts.close)
            try:
                node.wait(timeout=10 if c is not None else 0.1)  # after a shutdown they end by themselves
            except subprocess.TimeoutExpired:
                os.killpg(node.pid, signal.SIGKILL)
                node.wait(timeout=10)
        if took_s is None or took_s > SLOW_S:  # what the ranks said (retries, drops) explains a slow start
            for i, log in enumerate(logs):
                log.seek(0)
                said += "".join(f"\n    node {i}: {line.rstrip()[:200]}" for line in log if "[kit]" in line)
        for log in logs:
            log.close()
    return took_s, said


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--silent", type=int, default=50)
    p.add_argument("--trickling", type=int, default=50)
    p.add_argument("--no-flood", action="store_true", help="leave out the flood of fresh connections")
    p.add_argument("--netns", action="store_true", help="also the two-host case in network namespaces (root)")
    p.add_argument("--only-netns", action="store_true", help="only the namespace modes (implies --netns)")
    args = p.parse_args()
    modes = [] if args.only_netns else ["quiet", "hostile"] + ([] if args.no_flood else ["flood"])
    hosts = None
    if args.netns or args.only_netns:
        why = unavailable()
        if why:
            print(f"skipping the network-namespace modes: {why}", flush=True)
            if not modes:
                return
        else:
            modes += ["ns-quiet"] + ([] if args.no_flood else ["ns-flood-other", "ns-flood-node"])
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a kill runs the clean-up below, as Ctrl-C does
    try:
        if any(m.startswith("ns-") for m in modes):
            hosts = Hosts()
        run(modes, args, hosts)
    finally:
        if hosts is not None:
            hosts.close()


def run(modes: list[str], args: argparse.Namespace, hosts: Hosts | None) -> None:
    key_file = tempfile.mkdtemp() + "/kit.key"
    times: dict[str, list[float]] = {m: [] for m in modes}
    failed: dict[str, int] = {m: 0 for m in modes}
    for i in range(args.repeats):
        for mode in modes[i % len(modes):] + modes[:i % len(modes)]:  # interleaved, each order in turn
            if mode.startswith("ns-"):
                took_s, said = netns_time(mode, hosts, key_file)  # type: ignore[arg-type]
            else:
                took_s, said = start_time(mode, args, key_file)
            load = os.getloadavg()[0]
            if took_s is None:
                failed[mode] += 1
                print(f"{mode:14s} FAILED{said} [load {load:.1f}]", flush=True)
            else:
                times[mode].append(took_s)
                print(f"{mode:14s} attach {took_s:.2f} s{said} [load {load:.1f}]", flush=True)

    def med(mode: str) -> str:
        return f"{statistics.median(times[mode]):.2f} s" if times[mode] else "none attached"

    def ratio(mode: str, base: str) -> str:
        if not times[mode] or not times[base]:
            return ""
        lost = f", {failed[mode]}/{args.repeats} not attached" if failed[mode] else ""
        return f" (ratio {statistics.median(times[mode]) / statistics.median(times[base]):.2f}{lost})"

    if "quiet" in times:
        line = f"median, loopback: quiet {med('quiet')}, with {args.silent} silent + {args.trickling} trickling " \
               f"{med('hostile')}{ratio('hostile', 'quiet')}"
        if "flood" in times:
            line += f", under a flood of fresh connections {med('flood')}{ratio('flood', 'quiet')}"
        print(line)
    if "ns-quiet" in times:
        line = f"median, two hosts (namespaces): quiet {med('ns-quiet')}"
        if "ns-flood-other" in times:
            line += f", flood from a third host {med('ns-flood-other')}{ratio('ns-flood-other', 'ns-quiet')}, " \
                    f"flood from the ranks' own host {med('ns-flood-node')}{ratio('ns-flood-node', 'ns-quiet')}"
        print(line)


if __name__ == "__main__":
    main()
