"""Kernel side: the ranks of a cluster whose processes are torchrun's, not the kernel's children
(`launcher="attach"`: started by you on other machines; `launcher="torchrun"`: started here by the kit
as torchrun nodes). Owns the key file, the listener, the printed commands and, for local nodes, the
torchrun agents; `Cluster` uses the attached ranks like local ones."""
from __future__ import annotations

import os
import select
import socket
import subprocess
import time
from typing import Any, Callable, Iterable

from kit.config import LaunchConfig
from kit.engine import torchrun
from kit.engine.attach import DEFAULT_KEY_FILE, AttachedRank, Listener, attach_command
from kit.engine.io import DISCONNECTED
from kit.engine.launcher import Watchdog
from kit.engine.whole_frames import sigint_held
from kit.handshake import create_key_file
from kit.messages import INTERRUPT, WELCOME
from kit.protocol import Channel

__all__ = ["RemoteRanks"]

Emit = Callable[[int, str, str], None]
CLOSE_GRACE_S = 3.0  # after "shutdown": how long attached ranks get to close their connections


class RemoteRanks:
    def __init__(self, config: LaunchConfig, run_dir: str, session: str):
        self.config, self.run_dir, self.session = config, run_dir, session
        self.key_file = os.path.abspath(os.path.expanduser(config.key_file or DEFAULT_KEY_FILE))
        self.listener: Listener | None = None
        self.agents: list[subprocess.Popen[bytes]] = []
        self.ranks: list[AttachedRank] = []
        self.watchdog: Watchdog | None = None  # only for torchrun nodes started here

    @property
    def address(self) -> str:
        assert self.listener is not None
        return f"{self.listener.host}:{self.listener.port}"

    def command(self) -> str:
        """What to run on each node (one rank per node; change --nproc-per-node and --nnodes to taste)."""
        assert self.listener is not None
        host = self.listener.host
        if host in ("0.0.0.0", "::"):  # bound to every interface: the nodes need a name that reaches us
            host = socket.getfqdn()
        return attach_command(host, self.listener.port, self.key_file, self.config.world_size, 1)

    def describe(self) -> dict[str, Any]:
        """What Cluster.status() says of attached ranks: where they attach, with which key file and command,
        the torchrun agents this kernel started (launcher="torchrun"), and the attachers refused so far."""
        lis = self.listener
        return {"address": self.address if lis else None, "key_file": self.key_file,
                "command": self.command() if lis else None, "agents": [a.pid for a in self.agents],
                "refused": list(lis.refused) if lis else [], "refused_total": lis.refused_total if lis else 0}

    def open(self, marker: str, emit: Emit) -> tuple[list[AttachedRank], dict[int, Channel]]:
        """Key file (created 0600 when missing), listener, the torchrun nodes or the instructions; then wait."""
        key = create_key_file(self.key_file)
        self.listener = Listener(self.config.world_size, key, self.config.host, self.config.port)
        if self.config.launcher == "torchrun":  # the agents carry the session marker: the watchdog's to kill
            self.watchdog = Watchdog(self.session)
            self.agents = torchrun.launch_nodes(self.config, self.address, self.key_file, self.run_dir, self.session)
            for agent in self.agents:
                self.watchdog.watch(agent.pid)
        else:
            where = "this machine only (loopback)" if self.listener.host.startswith("127.") else self.listener.host
            emit(-1, "stderr", f"waiting for {self.config.world_size} ranks on {self.address} ({where}). On each "
                               f"node, with the kit installed and a copy of {self.key_file} (mode 0600), run:\n"
                               f"  {self.command()}\n"
                               f"(replace NODE0_HOST with the first node's address; torchrun then runs "
                               f"with --max-restarts 0, so a failing rank is reported here, not restarted)")
        self.ranks = self.listener.wait(self.config.start_timeout_s, emit,
                                        lambda: torchrun.failed(self.agents, self.run_dir))
        self.listener.keep_refusing(emit)
        return self.ranks, {a.rank: a.chan for a in self.ranks}

    def welcome(self, marker: str) -> None:
        """Every rank is in: each waited for this before joining the group."""
        for a in self.ranks:
            a.chan.send(WELCOME, {"marker": marker, "backend": "auto" if self.config.device == "gpu" else "gloo",
                                    "pg_timeout_s": self.config.pg_timeout_s, "threads": self.config.threads_per_rank})

    def interrupt(self, ranks: Iterable[int]) -> None:
        """No signals across machines: the rank's control thread interrupts its own main thread."""
        for r in ranks:
            try:
                with sigint_held():  # a second Ctrl-C must not cut this frame in half
                    self.ranks[r].chan.send(INTERRUPT, {})
            except (OSError, IndexError):
                pass

    def exit_code(self, rank: int) -> str:
        return DISCONNECTED

    def lost_template(self, rank: int) -> None:
        """torchrun starts attached ranks: no rank template of ours is involved."""

    def close(self) -> None:
        """After the ranks were sent "shutdown": let them close, then close what is left."""
        if self.listener is not None:
            self.listener.close()
        deadline = time.monotonic() + CLOSE_GRACE_S
        open_socks = [r.sock for r in self.ranks]
        while open_socks and time.monotonic() < deadline:  # peek only: the IO thread reads the last frames
            readable, _, _ = select.select(open_socks, [], [], 0.1)
            for s in readable:
                try:
                    if not s.recv(1, socket.MSG_PEEK):
                        open_socks.remove(s)
                except OSError:
                    open_socks.remove(s)
            if readable and open_socks:
                time.sleep(0.02)
        for r in self.ranks:
            r.chan.close()  # a rank still connected sees end of file and exits
        if self.agents:
            torchrun.stop_nodes(self.agents)
        if self.watchdog is not None:
            self.watchdog.close()
