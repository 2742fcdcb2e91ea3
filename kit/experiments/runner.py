"""Worker side: run one experiment on this rank and return what it measured.

`run_rank` runs inside an initialised process group (the kit's workers, torchrun, or a test's
spawn harness): build the workload, wrap it in the strategy, run warm-up + timed steps through
a real DataLoader, then one untimed probe step for the memory snapshot. `merge` (pure, kernel
side) lives in records.py.
"""
from __future__ import annotations

import os
import platform
import sys
from typing import Any

import torch
import torch.distributed as dist

from kit.rank import hooks as _hooks, stop_request as _stop_request
from kit.experiments.config import ExperimentConfig
from kit.experiments.choices import ONE_PROCESS, SHARDS_DATA, STAGED
from kit.experiments.measure.callbacks import settle
from kit.experiments.measure.clocks import ClockSync, agree
from kit.experiments.measure.memory import measure_memory, reset_peak
from kit.experiments.measure.timing import StepClock
from kit.experiments.choices import WORKLOAD_SIZES
from kit.experiments.measure.workloads import build_workload, make_loader
from kit.experiments.models import CLASSES, MLP_IN
from kit.experiments.measure.group_device import group_device
from kit.experiments.strategies.base import Strategy
from kit.experiments.strategies.registry import build_strategy, strategy_class
from kit.experiments.theory.bubble import bubble_report, explain
from kit.units import MIB

__all__ = ["run_rank", "build_strategy", "device_for_rank"]


def device_for_rank() -> torch.device:
    return group_device() if dist.is_initialized() else torch.device("cpu")


def _predicted_activations_mib(cfg: ExperimentConfig) -> float | None:
    """Hand count for the fp32 MLP: each Linear saves its input, each ReLU its output (the next
    Linear's input, the same storage), cross-entropy saves log-probs, int64 targets, one scalar."""
    if cfg.workload != "mlp" or cfg.precision != "fp32" or cfg.activation_checkpointing:
        return None
    if cfg.strategy in STAGED:
        return None  # split across ranks; per-stage counts are measured
    width, depth = WORKLOAD_SIZES["mlp"][cfg.model_size]
    b = cfg.batch_size // cfg.grad_accum_steps
    return (4 * b * (MLP_IN + depth * width + CLASSES) + 8 * b + 4) / MIB


def env_info(device: torch.device) -> dict[str, Any]:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else (platform.processor() or "cpu")
    return {"torch": str(torch.__version__), "backend": dist.get_backend() if dist.is_initialized() else "none",
            "device_type": device.type, "device_name": name, "cpu_count": os.cpu_count() or 1,
            "threads_per_rank": torch.get_num_threads(), "python": platform.python_version()}


def run_rank(config: dict[str, Any], stoppable: bool = False, profile: bool = False) -> dict[str, Any]:
    """Run the experiment on this rank; returns this rank's partial result (see records.merge).
    `stoppable`: between steps, the ranks agree whether the kernel asked this request to stop (its
    Stop; kit.rank.stop_request) and, if so, all end at that step.
    `profile`: torch.profiler on for every step, the steps and phases as spans ("profile" key)."""
    cfg = ExperimentConfig.from_dict(config)
    rank = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1
    device = device_for_rank()
    if cfg.strategy in ONE_PROCESS:
        if rank != 0:
            return {"rank": rank, "skipped": True}
    elif world != cfg.world_size:
        raise RuntimeError(f"config world_size={cfg.world_size} but the process group has {world} ranks; "
                           f"start the cluster with world_size={cfg.world_size}")
    wl = build_workload(cfg.workload, cfg.model_size, cfg.seed, checkpointing=cfg.activation_checkpointing,
                        memmap=cfg.dataset == "memmap",
                        n_samples=max(512, 4 * cfg.global_batch_size))
    strat: Strategy | None = None
    recorder: Any = None
    try:
        # Data: data-sharding ranks read disjoint shards; the others read the full batch (the
        # pipeline's first stage consumes inputs, its last the targets; dp scatters it itself).
        sharded = cfg.strategy in SHARDS_DATA
        loader = make_loader(wl.dataset, strategy_class(cfg).loader_batch(cfg), rank if sharded else 0,
                             world if sharded else 1, cfg.seed)
        reset_peak(device.type)  # persistent ranks: the peak of *this* run, not the process's lifetime
        clock = StepClock(cfg.instrument, device.type)
        strat = build_strategy(cfg, wl.model, wl.loss, device, clock)
        loader = strat.prepare_loader(loader)  # accelerate: prepare() shards the unsharded loader itself
        # One time axis for every rank (clocks.py): timelines line up, a send precedes its recv.
        many = cfg.strategy not in ONE_PROCESS
        sync = agree(device) if many else ClockSync(0.0, 0.0, 0.0, "one process")
        clock.origin_ms = sync.origin_ms if many else None
        strat.set_clock_offset(sync.offset_ms)
        if profile:  # only now: the profile holds the steps, not the model's construction
            from kit.rank.profile import Recorder
            recorder = Recorder(rank, offset_us=sync.offset_ms * 1e3).start()
        memory, timeline, stopped = _train(cfg, strat, clock, loader, rank, device, stoppable, recorder)
        out = _partial_result(cfg, strat, clock, rank, device, sync, timeline)
        out["memory"] = memory if not stopped else {}
        out["stopped"] = stopped
        if recorder is not None:
            out["profile"], recorder = recorder.stop(), None
        # gloo's threads release the kit's timing callbacks late on a busy machine; a script that
        # returns before they do can abort at exit under torchrun (measure/callbacks.py). Only on
        # success: after an interrupt a collective may never complete, and the user waits for nobody.
        settle()
        return out
    finally:
        if recorder is not None:  # the run failed: leave no profiler running on the rank
            recorder.stop()
        wl.dataset.close()
        if strat is not None:
            strat.close()  # accelerate: give back the notebook's Accelerate state


def _train(cfg: ExperimentConfig, strat: Strategy, clock: StepClock, loader: Any, rank: int, device: torch.device,
           stoppable: bool, recorder: Any = None) -> tuple[dict[str, Any], list[dict[str, Any]], bool]:
    """Warm-up, timed steps, then one untimed probe step for the memory snapshot.
    Returns (memory, the last timed step's timeline, stopped early). `recorder`: a profile's
    kit/rank/profile.Recorder, given each step's phases."""
    total = cfg.warmup_steps + cfg.steps
    epoch, it = 0, iter(loader)
    memory: dict[str, Any] = {}
    timeline: list[dict[str, Any]] = []

    def probe() -> None:
        memory.update(measure_memory(rank, strat.params, strat.opt, strat.meter.bytes, device.type,
                                     predicted_activations_mib=_predicted_activations_mib(cfg)))
        memory["grads_mib"] += strat.extra_grad_bytes() / MIB
        strat.adjust_memory(memory)  # sharded strategies: local shards, ZeRO formula

    for step in range(total + 1):  # +1: the untimed probe step for memory
        try:
            x, y = next(it)
        except StopIteration:
            epoch += 1
            loader.sampler.set_epoch(epoch)  # a new shuffle per epoch, the same on every rank
            it = iter(loader)
            x, y = next(it)
        probe_step = step == total
        if step == cfg.warmup_steps:
            strat.reset_buckets()  # DDP rebuilds its buckets after the first step
        clock.begin()
        loss = strat.train_step(x, y, probe=probe if probe_step else None)
        if rank == 0:
            _hooks.progress(step + 1, total + 1, force=probe_step)  # the lab bench shows "step k/n"
        row = clock.end(step - cfg.warmup_steps, rank, loss, x.shape[0], keep=cfg.warmup_steps <= step < total)
        if recorder is not None:
            label = "warm-up step" if step < cfg.warmup_steps else "memory probe step" if probe_step \
                else f"step {step - cfg.warmup_steps}"
            _profile_step(recorder, clock, row["step_ms"], label)
        strat.after_step()
        if step == total - 1 and cfg.instrument:
            timeline = clock.timeline(rank, step - cfg.warmup_steps)
        if stoppable and not probe_step and _agree_to_stop(device, cfg.strategy not in ONE_PROCESS):
            return memory, timeline, True
    return memory, timeline, False


def _partial_result(cfg: ExperimentConfig, strat: Strategy, clock: StepClock, rank: int, device: torch.device,
                    sync: ClockSync, timeline: list[dict[str, Any]]) -> dict[str, Any]:
    """This rank's rows, buckets, notes and what the strategy reports about itself."""
    out: dict[str, Any] = {
        "rank": rank, "steps": clock.rows, "timeline": timeline, "buckets": strat.bucket_sizes(),
        "param_bytes": sum(p.numel() * p.element_size() for p in strat.params),
        "notes": list(strat.notes), "emulated": bool(strat.emulated or cfg.link),
        "env": env_info(device), "clock": sync.to_dict(),
    }
    if sync.method == "ping-pong":  # across hosts the alignment is an estimate: say how good
        out["notes"].append(f"rank {rank} clock aligned to rank 0 by ping-pong: offset "
                            f"{sync.offset_ms:.3f} ms, error up to {sync.error_ms:.3f} ms")
    ddp_logging = strat.ddp_logging()
    if ddp_logging is not None:
        out["ddp_logging"] = ddp_logging
    stages = strat.stage_table(cfg.warmup_steps, cfg.warmup_steps + cfg.steps)
    if stages is not None:
        # pipeline/model parallel: every stage's busy time and the *global* span per timed step;
        # merge's mean of 1 - busy/span over stages is then 1 - sum busy / (p x span).
        out["busy_ms"] = [b[stages.stage] for b in stages.busy_ms]
        out["span_ms"] = stages.span_ms
        out["p2p_bytes"] = stages.p2p_bytes
        rep = bubble_report(stages.busy_ms, stages.span_ms, stages.micro_batches, stages.virtual_stages)
        out["bubble"] = rep
        if rep:  # uninstrumented runs time no phases, so there is no bubble to explain
            out["notes"].append(explain(rep))
    if strat.link:
        strat.link.close()
    report = strat.comm_report()  # sharding/compression/param server: bytes per collective
    if report is not None:
        out["comm_report"] = report
    return out


def _profile_step(recorder: Any, clock: StepClock, step_ms: float, label: str) -> None:
    """One step's StepClock stamps (perf_counter ms) as trace spans: the step, its phases, the DDP
    hooks' comm intervals (on their own row: they overlap backward by design)."""
    recorder.span(label, clock.t0 * 1e3, (clock.t0 + step_ms) * 1e3, cat="step")
    for phase, kind, s, e in clock.events:
        recorder.span(phase, s * 1e3, e * 1e3, cat="comm" if kind == "comm" else "phase", kind=kind)
    for i, (s, e) in enumerate(sorted(clock.comm)):
        recorder.span(f"bucket all-reduce #{i}", s * 1e3, e * 1e3, cat="comm", row="kit: gradient buckets")


def _agree_to_stop(device: torch.device, collective: bool) -> bool:
    """Every rank must stop at the same step (or a collective hangs): MAX-reduce a flag, so a rank
    whose Stop frame is still on its way stops with the ones that got theirs. Runs outside the timed
    step, only when the kernel asked for stoppable runs; under plain torchrun the flag never sets."""
    flag = torch.tensor([1.0 if _stop_request.asked() else 0.0], device=device)
    if collective and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


if __name__ == "__main__":  # torchrun entry: `torchrun --nproc-per-node 2 -m kit.experiments.runner`
    import json
    dist.init_process_group("gloo")
    res = run_rank(ExperimentConfig(**json.loads(sys.argv[1] if len(sys.argv) > 1 else "{}")).to_dict())
    print(json.dumps({"rank": res["rank"], "step_ms": [r["step_ms"] for r in res["steps"]]}))
    dist.destroy_process_group()
