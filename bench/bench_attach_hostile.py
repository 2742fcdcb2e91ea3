"""The attach listener under a hostile network: how long two real ranks (torchrun nodes on this machine,
`launcher="torchrun"`) take to attach with 50 silent and 50 trickling (a byte every 2 s) connections held
open against the listener, each reopened when the listener drops it; against the same start with no
attackers, interleaved.

    python bench/bench_attach_hostile.py [--repeats 3] [--silent 50] [--trickling 50]
"""
from __future__ import annotations

import argparse
import selectors
import socket
import statistics
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


def start_time(hostile: bool, args: argparse.Namespace, key_file: str) -> tuple[float, int, int]:
    port = _free_port()
    stop, stats = threading.Event(), {"opened": 0}
    t = threading.Thread(target=attack, args=(port, args.silent, args.trickling, stop, stats), daemon=True)
    if hostile:  # the attackers connect as soon as the listener opens, seconds before the torchrun nodes do
        t.start()
    t0 = time.perf_counter()
    c = Cluster(LaunchConfig(world_size=2, launcher="torchrun", port=port, key_file=key_file,
                             start_timeout_s=120)).start()
    took_s = time.perf_counter() - t0
    open_at_attach = stats.get("open_now", 0)
    try:
        assert c.run("t = torch.ones(1)\ndist.all_reduce(t)\nt.item()", on_output=QUIET).values == {0: 2.0, 1: 2.0}
    finally:
        c.shutdown()
        stop.set()
        if hostile:
            t.join(timeout=10)
    return took_s, stats["opened"], open_at_attach


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--silent", type=int, default=50)
    p.add_argument("--trickling", type=int, default=50)
    args = p.parse_args()
    key_file = tempfile.mkdtemp() + "/kit.key"
    times: dict[bool, list[float]] = {False: [], True: []}
    for i in range(args.repeats):
        for hostile in ((False, True) if i % 2 == 0 else (True, False)):
            took_s, opened, open_at_attach = start_time(hostile, args, key_file)
            times[hostile].append(took_s)
            print(f"{'hostile' if hostile else 'quiet':8s} attach {took_s:.2f} s" + (
                f" ({open_at_attach} attacker connections open when the ranks were in, {opened} opened in all)"
                if hostile else ""), flush=True)
    q, h = statistics.median(times[False]), statistics.median(times[True])
    print(f"median: quiet {q:.2f} s, with {args.silent} silent + {args.trickling} trickling {h:.2f} s "
          f"(ratio {h / q:.2f})")


if __name__ == "__main__":
    main()
