"""One copy of each fact: the ring's step counts and byte factor (theory/links.py), the per-rank memory of
parameters, gradients and Adam state (theory/parallel_memory.py) and the byte units (kit/units.py) are
written once; these tests fail when a module writes one of them again, and check the owners' numbers."""
from __future__ import annotations

import ast
import pathlib

import pytest

from test_layering import SHARED_MAY_IMPORT

ROOT = pathlib.Path(__file__).resolve().parent.parent
KIT = ROOT / "kit"
RING_OWNER = KIT / "experiments" / "theory" / "links.py"
# `2 * (X - 1)` that is not a ring collective's step count, by (module, function): what it counts instead
NOT_THE_RING = {
    ("kit/experiments/theory/comm_bytes.py", "predict_cp_bytes"):
        "ring attention sends K and V at each of its cp-1 steps: two sends a step, not a collective's steps",
}


def _modules() -> list[tuple[str, ast.Module]]:
    return [(path.relative_to(ROOT).as_posix(), ast.parse(path.read_text())) for path in sorted(KIT.rglob("*.py"))]


def _minus_one_of(node: ast.AST) -> str | None:
    """`X - 1` -> X (unparsed) for a name or attribute X, else None."""
    if (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub) and isinstance(node.right, ast.Constant)
            and node.right.value == 1 and isinstance(node.left, (ast.Name, ast.Attribute))):
        return ast.unparse(node.left)
    return None


def _factors(node: ast.AST) -> list[ast.AST]:
    """The factors of a product: a * (b - 1) * c -> [a, b - 1, c]."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        return _factors(node.left) + _factors(node.right)
    return [node]


def _functions(tree: ast.Module) -> dict[ast.AST, str]:
    """Every node -> the name of the function it sits in ("" at module level)."""
    where: dict[ast.AST, str] = {}
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                where.setdefault(node, fn.name)
    return where


def _ring_copies(module: str, tree: ast.Module) -> list[str]:
    where, found, lines = _functions(tree), [], set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.BinOp) or node.lineno in lines:  # one report a line
            continue
        if isinstance(node.op, ast.Div):  # (n - 1) / n, 2 * (n - 1) / n, S * (n - 1) / n: the ring factor
            n = ast.unparse(node.right)
            if any(_minus_one_of(f) == n for f in _factors(node.left)):
                found.append(f"{module}:{node.lineno}: {ast.unparse(node)} (links.ring_factor)")
                lines.add(node.lineno)
        elif isinstance(node.op, ast.Mult):  # 2 * (n - 1): an all-reduce's ring steps
            factors = _factors(node)
            if (any(isinstance(f, ast.Constant) and f.value == 2 for f in factors)
                    and any(_minus_one_of(f) for f in factors) and (module, where.get(node, "")) not in NOT_THE_RING):
                found.append(f"{module}:{node.lineno}: {ast.unparse(node)} (links.ring_steps)")
                lines.add(node.lineno)
    return found


def test_the_ring_factor_and_steps_are_written_once() -> None:
    """docs/architecture.md: the ring formula is written once, in theory/links.py (RING_STEPS, ring_steps,
    ring_factor, _ring_s). An inline (n-1)/n or 2(n-1) elsewhere is a second copy that can drift."""
    copies = [c for module, tree in _modules() if KIT / module.removeprefix("kit/") != RING_OWNER
              for c in _ring_copies(module, tree)]
    assert not copies, "write the ring through theory/links.py:\n" + "\n".join(copies)


def test_the_ring_rule_finds_the_copies_it_is_for() -> None:
    """The rule above sees the forms the audit found (hand_parts, layout_zero, local_check, collectives)."""
    for text in ("w = 2 * (t - 1) / t * n", "x = (n - 1) / n * nbytes / bw", "y = nbytes * (nodes - 1) / nodes",
                 "a = t_ms / (2 * (p - 1))", "s = {'all_reduce': 2 * (n - 1)}", "c = 2 * (self.n - 1)"):
        assert _ring_copies("kit/x.py", ast.parse(text)), text
    for text in ("b = (sum(s) + (n - 1) * max(s)) / n", "v = ((v - 1) * p + 1) / v", "r = (p - rank - 1) * 2"):
        assert not _ring_copies("kit/x.py", ast.parse(text)), text


def test_the_ring_owner_gives_the_textbook_numbers() -> None:
    """Thakur, Rabenseifner & Gropp 2005: an all-reduce is 2(p-1) steps and sends 2(p-1)/p of the array per
    rank, reduce-scatter and all-gather (p-1) and (p-1)/p; the benchmark's alpha split reads the same steps."""
    from kit.experiments.benchmarks.collectives import latency_steps
    from kit.experiments.theory.links import ring_factor, ring_steps
    from kit.experiments.theory.sharding_theory import ring_factor as re_exported
    assert re_exported is ring_factor
    for p in range(1, 65):
        assert ring_steps("all_reduce", p) == latency_steps("all_reduce", p) == 2 * (p - 1)
        assert ring_steps("all_gather", p) == latency_steps("reduce_scatter", p) == p - 1
        assert ring_factor("all_reduce", p) == 2 * (p - 1) / p
        assert ring_factor("all_gather", p) == ring_factor("reduce_scatter", p) == ring_factor("broadcast", p) \
            == (p - 1) / p
    assert latency_steps("broadcast", 4) is None


def test_zero_in_a_node_is_the_ring_of_links() -> None:
    """layout_zero's collective inside one node is links.py's ring on the node's link (one formula)."""
    from kit.experiments.theory.cluster import cluster_spec
    from kit.experiments.theory.layout_zero import ring_collective_s
    from kit.experiments.theory.links import link_collective_s
    c = cluster_spec(2, 8, "h100")
    for n in (2, 3, 4, 8):
        for nbytes in (1e3, 7.7e6, 1.3e9):
            assert ring_collective_s(nbytes, n, 1, c) == link_collective_s("reduce_scatter", c.intra, nbytes, n)
    # across nodes the nodes' ring moves each byte into a node once: a 2-node group of 16 ranks moves
    # half the array through the 8 GPUs' NICs, 1/16 of it each
    nbytes = 1e9
    nic_s = ring_collective_s(nbytes, 16, 1, c) - (c.nic.base_us + 15 * c.nic.hop_us) * 1e-6
    assert nic_s == pytest.approx(nbytes / 2 / 8 / (c.egress_gbps_per_gpu * c.nic.efficiency * 1e9), rel=1e-12)


def test_adam_state_per_rank_is_one_formula() -> None:
    """theory/parallel_memory.state_mib is the one formula of parameters, gradients and Adam state per rank:
    no module outside theory/ reads its byte sizes (or sharding_theory's bytes per parameter) to write it again."""
    owned = ("F32", "adam_bytes", "STEP_BYTES", "zero_bytes_per_param")
    copies = [f"{module}:{node.lineno}: imports {a.name}" for module, tree in _modules()
              if not module.startswith("kit/experiments/theory/") for node in ast.walk(tree)
              if isinstance(node, ast.ImportFrom) and node.module in (
                  "kit.experiments.theory.parallel_memory", "kit.experiments.theory.sharding_theory")
              for a in node.names if a.name in owned]
    assert not copies, "use parallel_memory.state_mib:\n" + "\n".join(copies)
    from kit.experiments.theory.parallel_memory import state_mib
    from kit.units import MIB
    n, tensors, d = 1_234_567, 38, 3   # a model's parameter and tensor counts, sharded over 3 ranks
    got = state_mib(n, tensors, d, over="d")
    assert got["params_mib"] == got["grads_mib"] == 4 * n / d / MIB
    assert got["optimizer_mib"] == (2 * 4 * n / d + 4 * tensors) / MIB
    assert got["formula"]["optimizer"] == "Adam: 8 bytes x P / d + 4 bytes x tensors (step)"
    whole = state_mib(n, tensors, of="P_stage")
    assert whole["optimizer_mib"] == (8 * n + 4 * tensors) / MIB and whole["formula"]["grads"] == "4 bytes x P_stage"


def test_every_strategy_predicts_adam_state_with_the_one_formula() -> None:
    """fsdp and zero1 (sharding_theory.zero_prediction), hsdp and the meshes (state_mib), single and ddp
    (measure/memory.predict_memory) predict Adam's state as torch allocates it: 8 bytes per parameter plus
    `step`, a 4-byte fp32 scalar per parameter tensor (torch.optim.Adam). Under FSDP every rank keeps a step
    per tensor; torch's ZeRO-1 gives each rank whole tensors, tensors / N steps on average. A second copy that
    leaves `step` out (zero_prediction's 8/N bytes/param before) fails here."""
    torch = pytest.importorskip("torch")
    from kit.experiments.measure.memory import optimizer_bytes, predict_memory
    from kit.experiments.theory.parallel_memory import state_mib
    from kit.experiments.theory.sharding_theory import zero_prediction
    from kit.units import MIB
    n, tensors, world = 1_234_568, 38, 4
    fsdp, hsdp = zero_prediction(3, n, world, tensors)["fp32"], state_mib(n, tensors, world, over="s")
    assert fsdp["optimizer_mib"] == hsdp["optimizer_mib"] == (8 * n / world + 4 * tensors) / MIB
    assert fsdp["params_mib"] == hsdp["params_mib"] == 4 * n / world / MIB
    zero1 = zero_prediction(1, n, world, tensors, whole_tensors=True)["fp32"]
    assert zero1["optimizer_mib"] == (8 * n + 4 * tensors) / world / MIB and zero1["params_mib"] == 4 * n / MIB
    assert "4 bytes x tensors / N" in zero1["formula"] and "4 bytes x tensors (" in fsdp["formula"]
    # what torch allocates: one Adam step on a small model, every state tensor counted
    model = torch.nn.Sequential(torch.nn.Linear(5, 3), torch.nn.LayerNorm(3), torch.nn.Linear(3, 2))
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 5)).sum().backward()
    opt.step()
    numel, count = sum(p.numel() for p in model.parameters()), len(list(model.parameters()))
    steps = [st["step"] for st in opt.state.values()]
    assert len(steps) == count and all(s.dtype == torch.float32 and s.dim() == 0 for s in steps)
    assert optimizer_bytes(opt) == 8 * numel + 4 * count
    assert predict_memory(numel, count)["optimizer_mib"] * MIB == optimizer_bytes(opt)
    assert zero_prediction(0, numel, 1, count)["fp32"]["optimizer_mib"] * MIB == optimizer_bytes(opt)


_UNITS = {2**20: "MIB", 2**30: "GIB"}


def _constant(node: ast.AST) -> int | float | None:
    """The value of a constant expression such as 2**20, 1 << 20 or 1024 * 1024 (None: not constant)."""
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Pow, ast.LShift, ast.Mult)):
        a, b = _constant(node.left), _constant(node.right)
        if a is None or b is None:
            return None
        if isinstance(node.op, ast.LShift):
            return int(a) << int(b) if isinstance(a, int) and isinstance(b, int) else None
        return a ** b if isinstance(node.op, ast.Pow) else a * b
    return None


def _unit_copies(module: str, tree: ast.Module) -> list[str]:
    """Bytes converted to MiB or GiB (x / 2**20, x >> 20) or back (mib * 2**20, mib << 20) with the unit inline."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.BinOp) or _constant(node) is not None:
            continue
        shift = isinstance(node.op, (ast.RShift, ast.LShift)) and _constant(node.right) in (20, 30)
        divided = isinstance(node.op, (ast.Div, ast.FloorDiv)) and _constant(node.right) in _UNITS
        times = isinstance(node.op, ast.Mult) and any(_constant(x) in _UNITS for x in (node.left, node.right))
        if shift or divided or times:
            found.append(f"{module}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_byte_units_come_from_the_units_module() -> None:
    """docs/architecture.md: kit/units.py defines MIB and GIB once, and every module that converts bytes to them
    imports them. The exceptions are the shared modules the layering keeps from importing anything in kit
    (test_layering.SHARED_MAY_IMPORT: payload, diagnose, ...): they may not import units, so they write it."""
    may_not = {f"kit/{m.removeprefix('kit.')}.py" for m, allowed in SHARED_MAY_IMPORT.items() if "kit.units" not in allowed}
    copies = [c for module, tree in _modules() if module not in may_not for c in _unit_copies(module, tree)]
    assert not copies, "use kit.units.MIB / GIB:\n" + "\n".join(copies)
    for text in ("a = n / 2**20", "b = f'{x / 2 ** 30:.1f}'", "c = total >> 20", "d = copy_mib * 2**20 // 4",
                 "e = mib << 20", "f = n / (1024 * 1024)", "g = n / 1048576"):
        assert _unit_copies("kit/x.py", ast.parse(text)), text
    assert not _unit_copies("kit/x.py", ast.parse("s = sock.recv(1 << 20); t = 4 * 2**20; u = n / MIB"))
