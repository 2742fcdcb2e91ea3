"""The attach listener under a hostile network: how long two real ranks (torchrun nodes on this machine,
`launcher="torchrun"`) take to attach with 50 silent and 50 trickling (a byte every 2 s) connections held
open against the listener, each reopened when the listener drops it; with a flood of fresh connections
(one process opening them as fast as it can, from the ranks' own host: the listener can tell them apart
from the ranks only by their age); against the same start with no attackers, interleaved.

    python bench/bench_attach_hostile.py [--repeats 3] [--silent 50] [--trickling 50] [--no-flood]
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

from kit import Cluster, LaunchConfig

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
    s.connect_ex(("127.0.0.1", int(sys.argv[1])))
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
        [sys.executable, "-c", FLOOD, str(port)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        start_new_session=True)))
    if mode == "flood":  # started once the listener is up (a connect to a closed port may take it over)
        starter.start()
    t0 = time.perf_counter()
    try:
        c = Cluster(LaunchConfig(world_size=2, launcher="torchrun", port=port, key_file=key_file,
                                 start_timeout_s=120)).start()
    except BaseException:
        starter.cancel()  # a start that failed first must not leave a flood running after the bench
        if starter.is_alive():
            starter.join()
        for flood in floods:
            os.killpg(flood.pid, signal.SIGKILL)
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
            os.killpg(flood.pid, signal.SIGKILL)
            rates = flood.communicate(timeout=10)[0].split()
            said = f" (the flood opened {rates[-1] if rates else '<2000 in all, under'} connections/s)"
    return took_s, said


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--silent", type=int, default=50)
    p.add_argument("--trickling", type=int, default=50)
    p.add_argument("--no-flood", action="store_true", help="leave out the flood of fresh connections")
    args = p.parse_args()
    key_file = tempfile.mkdtemp() + "/kit.key"
    modes = ["quiet", "hostile"] + ([] if args.no_flood else ["flood"])
    times: dict[str, list[float]] = {m: [] for m in modes}
    for i in range(args.repeats):
        for mode in modes[i % len(modes):] + modes[:i % len(modes)]:  # interleaved, each order in turn
            took_s, said = start_time(mode, args, key_file)
            times[mode].append(took_s)
            print(f"{mode:8s} attach {took_s:.2f} s{said}", flush=True)
    q = statistics.median(times["quiet"])
    line = f"median: quiet {q:.2f} s, with {args.silent} silent + {args.trickling} trickling " \
           f"{statistics.median(times['hostile']):.2f} s (ratio {statistics.median(times['hostile']) / q:.2f})"
    if "flood" in times:
        f = statistics.median(times["flood"])
        line += f", under a flood of fresh connections {f:.2f} s (ratio {f / q:.2f})"
    print(line)


if __name__ == "__main__":
    main()
