"""Two more "hosts" on this machine for the attach benches: Linux network namespaces joined to the root
namespace by veth pairs. The kernel's listener stays in the root namespace on 10.77.0.1; "node" (10.77.0.2,
its own loopback up for torchrun's rendezvous and gloo) runs the ranks; "other" (10.77.1.2, routed to
10.77.0.1 through the root namespace's 10.77.1.1) is a third host. Needs root and iproute2's `ip`.

Everything is named after this process (`kb<pid>...`), so two benches never share a namespace, and
`Hosts.close()` ends what still runs inside them (our own children: nothing else can be in them) before
deleting them; deleting a namespace deletes the veth end inside it and so its peer.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time

LISTENER = "10.77.0.1"  # the kernel's end of the node's veth, in the root namespace
NODE = "10.77.0.2"
OTHER = "10.77.1.2"


def unavailable() -> str | None:
    """Why namespaces cannot be made here, or None."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "network namespaces need root (run the bench as root, or leave out --netns)"
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2) on PATH"
    return None


def _ip(*args: str) -> None:
    p = subprocess.run(["ip", *args], capture_output=True, text=True)
    if p.returncode != 0:
        raise OSError(f"ip {' '.join(args)}: {p.stderr.strip() or p.returncode}")


class Hosts:
    """The two namespaces and their veths; `exec_argv(ns)` prefixes a command to run inside one."""

    def __init__(self) -> None:
        tag = f"kb{os.getpid()}"
        self.node, self.other = f"{tag}node", f"{tag}other"
        self._made: list[str] = []
        self._etc_netns_ours = not os.path.exists("/etc/netns")
        try:
            for ns, root_if, ns_if, root_addr, ns_addr in (
                    (self.node, f"{tag}n0", f"{tag}n1", LISTENER, NODE),
                    (self.other, f"{tag}o0", f"{tag}o1", "10.77.1.1", OTHER)):
                _ip("netns", "add", ns)
                self._made.append(ns)
                # `ip netns exec` mounts this over /etc/resolv.conf: a resolver that answers at once (nothing
                # listens on 127.0.0.1:53), as a real host's does. The machine's own is unreachable from here,
                # and torch's store waits 10 s for each reverse lookup of a peer (c10d socket.cpp) on it.
                os.makedirs(f"/etc/netns/{ns}", exist_ok=True)
                with open(f"/etc/netns/{ns}/resolv.conf", "w") as f:
                    f.write("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
                _ip("-n", ns, "link", "set", "lo", "up")
                _ip("link", "add", root_if, "type", "veth", "peer", "name", ns_if)
                self._made.append(root_if)
                _ip("link", "set", ns_if, "netns", ns)
                _ip("addr", "add", f"{root_addr}/24", "dev", root_if)
                _ip("link", "set", root_if, "up")
                _ip("-n", ns, "addr", "add", f"{ns_addr}/24", "dev", ns_if)
                _ip("-n", ns, "link", "set", ns_if, "up")
                _ip("-n", ns, "route", "add", "default", "via", root_addr)  # the other host reaches 10.77.0.1
        except BaseException:
            self.close()
            raise

    def exec_argv(self, ns: str) -> list[str]:
        return ["ip", "netns", "exec", ns]

    def close(self) -> None:
        """Kill what still runs inside (ours), then delete the namespaces and veths. Idempotent."""
        for name in reversed(self._made):
            if name in (self.node, self.other):
                got = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True).stdout.split()
                for pid in got:
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except (ProcessLookupError, ValueError):
                        pass
                if got:
                    time.sleep(0.2)
                subprocess.run(["ip", "netns", "del", name], capture_output=True)
                shutil.rmtree(f"/etc/netns/{name}", ignore_errors=True)
        if self._etc_netns_ours:
            try:
                os.rmdir("/etc/netns")
            except OSError:  # gone already, or another bench's namespace is in it
                pass
            else:  # gone with its peer when the namespace went; deleted here when the namespace never got it
                subprocess.run(["ip", "link", "del", name], capture_output=True)
        self._made.clear()
