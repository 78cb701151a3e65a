"""Where a step's GPU time goes: the CUDA kernels (and copies) of a few LAMMPS steps, by
name, next to the bare model's in one process (``kokkos_lammps.py bench --profile``); where
its host time goes, phase by phase (``bench --phases``, :class:`_Phases`).

Inside LAMMPS, :func:`install` (run by ``profile_site/sitecustomize.py`` when
:data:`ENV` is set) wraps the doors' per-step entry points: ``nvalchemi/kk``'s
``frontends.kokkos.compute``, ``pair_style nvalchemi``'s ``PluginSession.compute`` and
ML-IAP's ``MLIAPModel.compute_forces``. On rank 0 it starts ``torch.profiler`` at the entry
of call ``FIRST`` and stops it at the entry of call ``FIRST + COUNT``: COUNT whole steps,
LAMMPS's own kernels between the calls (integration, position communication) included.
The kernel table (ms and launches per step, by name), the wall time and the time the GPU
was busy (kernel intervals merged) go to ``PATH`` as JSON.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

#: ``PATH:FIRST:COUNT``
ENV = "NVALCHEMI_PROFILE"
#: ``PATH:CALLS``: GPU memory of ``nvalchemi/kk``'s first CALLS steps, phase by phase
MEMORY_ENV = "NVALCHEMI_MEMORY"
#: ``PATH:FIRST:COUNT``: host time of each step's phases, synchronized (:class:`_Phases`)
PHASES_ENV = "NVALCHEMI_PHASES"
#: characters of a kernel's name kept (C++ template names run to kilobytes)
NAME = 96


def kernel_table(profile: Any, steps: int, wall_s: float) -> dict[str, Any]:
    """Per step: each device event's ms and count by (shortened) name, the GPU's busy ms
    (intervals merged: concurrent kernels count once) and the wall ms."""
    import torch

    kernels: dict[str, list[float]] = {}
    ops: dict[str, list[float]] = {}
    runtime: dict[str, list[float]] = {}
    spans = []
    for event in profile.events():
        if event.device_type != torch.autograd.DeviceType.CUDA:
            if event.name.startswith("aten::"):  # the host's share: ops called, nested too
                row = ops.setdefault(event.name, [0.0, 0.0])
                row[0] += event.self_cpu_time_total / 1e3 / steps
                row[1] += 1 / steps
            elif event.name.startswith("cuda"):  # CUDA runtime calls: launches, waits
                row = runtime.setdefault(event.name, [0.0, 0.0])
                row[0] += event.time_range.elapsed_us() / 1e3 / steps
                row[1] += 1 / steps
            continue
        start, end = event.time_range.start, event.time_range.end
        spans.append((start, end))
        row = kernels.setdefault(event.name[:NAME], [0.0, 0.0])
        row[0] += (end - start) / 1e3 / steps
        row[1] += 1 / steps
    busy, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end > reach:
            busy += end - max(start, reach)
            reach = end
    return {
        "steps": steps,
        "wall_ms": 1e3 * wall_s / steps,
        "gpu_busy_ms": busy / 1e3 / steps,
        "kernels": dict(sorted(kernels.items(), key=lambda kv: -kv[1][0])),
        "ops": dict(sorted(ops.items(), key=lambda kv: -kv[1][1])),
        "runtime": dict(sorted(runtime.items(), key=lambda kv: -kv[1][0])),
    }


def differences(step: dict[str, Any], model: dict[str, Any], rows: int = 20) -> str:
    """Totals, then the kernels whose ms/step and the aten ops whose calls/step differ most
    between a step and the bare model, as text."""
    launches = [sum(v[1] for v in t["kernels"].values()) for t in (step, model)]
    calls = [sum(v[1] for v in t["ops"].values()) for t in (step, model)]
    totals = (
        f"wall ms/step {step['wall_ms']:.3f} (model {model['wall_ms']:.3f}), GPU busy "
        f"{step['gpu_busy_ms']:.3f} (model {model['gpu_busy_ms']:.3f}), kernels/step "
        f"{launches[0]:.0f} (model {launches[1]:.0f}), aten ops/step {calls[0]:.0f} "
        f"(model {calls[1]:.0f})"
    )
    lines = [totals]
    if "inside_ms" in step:
        lines.append(
            f"host ms/step inside the pair style's Python call {step['inside_ms']:.3f}, "
            f"outside it (LAMMPS) {step['wall_ms'] - step['inside_ms']:.3f}"
        )
    tables = (("kernels", 0, "kernel"), ("runtime", 0, "CUDA runtime call"), ("ops", 1, "aten op"))
    for key, column, what in tables:
        ours, theirs = step.get(key, {}), model.get(key, {})
        table = {
            n: (ours.get(n, [0.0, 0.0]), theirs.get(n, [0.0, 0.0])) for n in set(ours) | set(theirs)
        }
        order = sorted(table, key=lambda n: -abs(table[n][0][column] - table[n][1][column]))
        lines.append(
            f"{'step ms':>9s} {'model ms':>9s} {'diff ms':>9s} {'step n':>7s} {'model n':>7s}  "
            + what
        )
        for n in order[:rows]:
            (s, sc), (m, mc) = table[n]
            lines.append(f"{s:9.3f} {m:9.3f} {s - m:9.3f} {sc:7.1f} {mc:7.1f}  {n}")
    return "\n".join(lines)


class _Window:
    """Profiles from the entry of call ``first`` to the entry of call ``first + count``."""

    def __init__(self, path: Path, first: int, count: int) -> None:
        self.path, self.first, self.count = path, first, count
        self.calls = 0
        self.profile: Any = None
        self.start = 0.0
        self.inside = 0.0  # host seconds inside the wrapped calls of the window

    def tick(self) -> None:
        import torch

        self.calls += 1
        cuda = torch.cuda.is_available()
        if self.calls == self.first:
            if cuda:
                torch.cuda.synchronize()
            activities = [torch.profiler.ProfilerActivity.CPU]
            activities += [torch.profiler.ProfilerActivity.CUDA] if cuda else []
            self.profile = torch.profiler.profile(activities=activities)
            self.profile.__enter__()
            self.start = time.perf_counter()
        elif self.calls == self.first + self.count:
            if cuda:
                torch.cuda.synchronize()
            wall = time.perf_counter() - self.start
            self.profile.__exit__(None, None, None)
            table = kernel_table(self.profile, self.count, wall)
            table["inside_ms"] = 1e3 * self.inside / self.count
            self.path.write_text(json.dumps(table, indent=1))

    def profiling(self) -> bool:
        return self.first <= self.calls < self.first + self.count


def _wrap(owner: Any, name: str, window: _Window) -> None:
    inner = getattr(owner, name)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        window.tick()
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            if window.profiling():
                window.inside += time.perf_counter() - start

    setattr(owner, name, wrapped)


class _Memory:
    """torch's GPU memory at marks within ``nvalchemi/kk``'s steps: at each mark the
    memory allocated then, the most allocated since the last mark, and the memory reserved
    (what the process holds from the driver); written after ``calls`` steps."""

    def __init__(self, path: Path, calls: int) -> None:
        self.path, self.calls, self.marks = path, calls, []
        self.step = 0

    def mark(self, label: str) -> None:
        import torch

        gib = 2**30
        self.marks.append(
            {
                "step": self.step,
                "mark": label,
                "allocated_gib": torch.cuda.memory_allocated() / gib,
                "peak_since_last_gib": torch.cuda.max_memory_allocated() / gib,
                "reserved_gib": torch.cuda.memory_reserved() / gib,
            }
        )
        torch.cuda.reset_peak_memory_stats()

    def wrap(self, owner: Any, name: str, before: str | None, after: str) -> None:
        inner = getattr(owner, name)

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            if self.step > self.calls:
                return inner(*args, **kwargs)
            if before:
                self.step += 1
                self.mark(before)
            result = inner(*args, **kwargs)
            self.mark(after)
            if before and self.step == self.calls:
                self.path.write_text(json.dumps(self.marks, indent=1))
            return result

        setattr(owner, name, wrapped)


class _Phases:
    """Where a step's time goes, calls ``first`` to ``first + count`` of a door: the time
    between the door's calls (LAMMPS and the C++ side of the door: integration,
    communication, the pairs), the call, and the model in it (``evaluate``), each ended
    by a CUDA synchronization, so each phase is its own, not the GPU's backlog. Medians in
    ms go to ``path`` as JSON."""

    def __init__(self, path: Path, first: int, count: int) -> None:
        self.path, self.first, self.count = path, first, count
        self.calls, self.returned = 0, None
        self.times: dict[str, list[float]] = {"between": [], "call": [], "model": []}

    def _now(self) -> float:
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return time.perf_counter()

    def _counted(self) -> bool:
        return self.first <= self.calls < self.first + self.count

    def wrap_call(self, owner: Any, name: str) -> None:
        inner = getattr(owner, name)

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            start = self._now()
            if self._counted() and self.returned is not None:
                self.times["between"].append(1e3 * (start - self.returned))
            result = inner(*args, **kwargs)
            self.returned = self._now()
            if self._counted():
                self.times["call"].append(1e3 * (self.returned - start))
            if self.calls == self.first + self.count - 1:
                self.write()
            return result

        setattr(owner, name, wrapped)

    def wrap_model(self, owner: Any, name: str) -> None:
        inner = getattr(owner, name)

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            start = self._now()
            result = inner(*args, **kwargs)
            if self._counted():
                self.times["model"].append(1e3 * (self._now() - start))
            return result

        setattr(owner, name, wrapped)

    def write(self) -> None:
        import statistics

        row = {f"{k}_ms": statistics.median(v) for k, v in self.times.items() if v}
        if "call_ms" in row and "model_ms" in row:
            row["call_outside_model_ms"] = row["call_ms"] - row["model_ms"]
        self.path.write_text(json.dumps({"calls": self.count, **row}, indent=1))


def install() -> None:
    """Wrap every door's per-step entry on rank 0 when :data:`ENV` is set, ``nvalchemi/kk``'s
    phases when :data:`MEMORY_ENV` is."""
    rank = os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "0"))
    if rank != "0":
        return
    if os.environ.get(MEMORY_ENV):  # on a GPU: torch's allocator is CUDA's
        from nvalchemi_lammps.frontends import kokkos

        path, calls = os.environ[MEMORY_ENV].rsplit(":", 1)
        memory = _Memory(Path(path), int(calls))
        memory.wrap(kokkos, "evaluate", None, "model")
        memory.wrap(kokkos, "compute", "entry", "forces added")
    if os.environ.get(PHASES_ENV):
        from nvalchemi_lammps.frontends import kokkos, mliap, plugin

        path, first, count = os.environ[PHASES_ENV].rsplit(":", 2)
        phases = _Phases(Path(path), int(first), int(count))
        for door in (kokkos, mliap, plugin):
            phases.wrap_model(door, "evaluate")
        phases.wrap_call(kokkos, "compute")
        phases.wrap_call(plugin.PluginSession, "compute")
        phases.wrap_call(mliap.MLIAPModel, "compute_forces")
    spec = os.environ.get(ENV)
    if not spec:
        return
    path, first, count = spec.rsplit(":", 2)
    window = _Window(Path(path), int(first), int(count))
    from nvalchemi_lammps.frontends import kokkos, mliap, plugin

    _wrap(kokkos, "compute", window)
    _wrap(plugin.PluginSession, "compute", window)
    _wrap(mliap.MLIAPModel, "compute_forces", window)
