"""Faults 17 and 20: output floods (C-level stderr and many prints) finish with a truncation marker;
unpicklable, unrebuildable or huge results come back as a repr with a note."""
from __future__ import annotations



from kit.engine.output import OUTPUT_CAP_BYTES, TAIL_SHOWN_CHARS
from conftest import quiet


WALL_CLOCK_S = 30  # conftest's autouse wall_clock fixture enforces it


def test_flood_of_c_level_stderr_and_prints_completes_with_a_marker(cluster):
    shown: list[tuple[int, str, str]] = []
    code = ("import os\nos.write(2, b'x' * 100 + b'\\n')\n"
            "for _ in range(50_000):\n    os.write(2, b'e' * 99 + b'\\n')\n"  # 5 MB straight to fd 2
            "for i in range(10_000):\n    print('line', i, '.' * 40)\n'finished'")  # ~500 KB
    r = cluster.run(code, on_output=lambda *a: shown.append(a))
    assert r.ok and r.values == {0: "finished", 1: "finished"}
    for rank in (0, 1):
        for stream in ("stdout", "stderr"):
            texts = [t for (rk, s, t) in shown if rk == rank and s == stream]
            assert sum(len(t) + 1 for t in texts) < OUTPUT_CAP_BYTES + 4096 + TAIL_SHOWN_CHARS  # bounded
            assert any("output truncated after 256 KiB" in t for t in texts)
            more = [i for i, t in enumerate(texts) if t.startswith("[kit] ") and "KiB more" in t and "not shown" in t]
            assert more, texts[-12:]
            last = "line 9999 " + "." * 40 if stream == "stdout" else "e" * 99  # each stream's last line
            assert texts[-1] == last and "the last" in texts[more[-1]], texts[more[-1]:]
    assert cluster.run("'still fine'", on_output=quiet).values[0] == "still fine"


def test_unpicklable_value_is_shown_as_repr_with_a_note(cluster):
    r = cluster.run("import threading\nthreading.Lock()", on_output=quiet)
    assert r.values[0].startswith("<unlocked _thread.lock") and "could not be sent" in r.replies[0]["value"]["note"]


def test_value_of_a_class_defined_in_a_cell_falls_back_to_repr(cluster):
    r = cluster.run("class Point:\n    def __repr__(self):\n        return 'Point()'\nPoint()", on_output=quiet)
    assert r.values == {0: "Point()", 1: "Point()"}
    assert "could not be rebuilt in the kernel" in r.replies[0]["value"]["note"]


def test_broken_repr_does_not_fail_the_cell(cluster):
    r = cluster.run("class Bad:\n    def __repr__(self):\n        raise RuntimeError('no')\n"
                           "    def __reduce__(self):\n        raise TypeError('nope')\nBad()", on_output=quiet)
    assert r.ok and r.values[0].startswith("<repr failed: RuntimeError: no>")


def test_huge_value_is_shown_as_repr_and_kept_on_the_rank(cluster):
    r = cluster.run("big = torch.zeros(25_000_000)\nbig", on_output=quiet)  # 100 MB > 64 MiB
    assert r.ok and "over the 64 MiB limit" in r.replies[1]["value"]["note"] and r.values[1].startswith("tensor(")
    assert cluster.run("big.numel()\n", on_output=quiet).values == {0: 25_000_000, 1: 25_000_000}
    cluster.run("del big", on_output=quiet)


def test_a_line_is_not_torn_when_the_kit_was_busy_while_its_rest_was_queued(cluster):
    """The kernel's main thread busy for over a second (interrupt handling, `where`, a slow front end)
    while a line's start and its rest both wait: the rest is read before the start is shown alone."""
    import time as _time

    shown: list[tuple[int, str, str]] = []

    def slow_front_end(rank: int, stream: str, text: str) -> None:
        shown.append((rank, stream, text))
        if text == "noise":
            _time.sleep(1.5)

    code = ("import sys, time\nif rank == 0:\n    sys.stdout.write('part1-'); sys.stdout.flush()\n"
            "    time.sleep(0.1)\n    sys.stderr.write('noise\\n'); sys.stderr.flush()\n    time.sleep(0.1)\n"
            "    print('part2')\n")
    r = cluster.run(code, on_output=slow_front_end)
    assert r.ok
    assert (0, "stdout", "part1-part2") in shown, shown
