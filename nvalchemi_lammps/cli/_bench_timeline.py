"""Where a profiled run's steps go on the GPU, from torch.profiler's timeline (Chrome's trace
format, as ``prof.export_chrome_trace`` writes it): how long the GPU was busy and idle per
step, the kernels' time by what launched them (a CUDA graph's replay, Kokkos, torch's
eager launches, copies), the longest kernels outside the graphs, and the longest idle
stretches with the host operations running meanwhile. This is what tells a step's cost
above the captured model apart: more work on the GPU, or the GPU waiting for the host."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

#: trace categories of GPU work and of the host calls that launch it
_GPU = ("kernel", "gpu_memcpy", "gpu_memset")
_LAUNCHES = ("cuda_runtime", "cuda_driver")


def timeline_summary(trace: dict[str, Any], steps: int, rows: int = 12) -> str:
    """The summary of ``trace`` (a run of ``steps`` steps) as text, per step."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    gpu = [e for e in events if e.get("cat") in _GPU]
    host = [e for e in events if e.get("cat") == "cpu_op"]
    if not gpu:
        return "GPU timeline: no GPU work in the trace\n"
    launcher = {
        e["args"].get("correlation"): e["name"]
        for e in events
        if e.get("cat") in _LAUNCHES and "args" in e
    }
    start = min(e["ts"] for e in host + gpu)
    end = max(e["ts"] + e["dur"] for e in host + gpu)
    busy, gaps = _busy_and_gaps(gpu)
    by_source: dict[str, float] = defaultdict(float)
    outside: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for e in gpu:
        source = _source(e, launcher.get(e.get("args", {}).get("correlation"), ""))
        by_source[source] += e["dur"]
        if source != "CUDA graphs":
            count = outside[e["name"]]
            count[0] += 1
            count[1] += e["dur"]

    def ms(us: float) -> str:
        return f"{us / 1e3 / steps:.3f} ms"

    idle = sum(g for g, _ in gaps)
    head = (
        f"GPU timeline, per step over {steps} steps: {ms(end - start)} in all, the GPU busy "
        f"{ms(busy)} and idle {ms(idle)} between its first and last work"
    )
    lines = [
        head,
        "GPU work by what launched it:",
        *(f"  {ms(t):>10}  {name}" for name, t in sorted(by_source.items(), key=lambda x: -x[1])),
        "longest kernels outside CUDA graphs (per step: count, time):",
        *(
            f"  {n / steps:6.1f} x {ms(t):>10}  {name[:100]}"
            for name, (n, t) in sorted(outside.items(), key=lambda x: -x[1][1])[:rows]
        ),
        "longest idle stretches of the GPU, with the host operations running meanwhile:",
    ]
    for gap, at in sorted(gaps, reverse=True)[:rows]:
        middle = at + gap / 2
        running = [e["name"] for e in host if e["ts"] <= middle <= e["ts"] + e["dur"]]
        lines.append(f"  {gap:8.1f} us  {' > '.join(running[-3:])[:120] or '(none traced)'}")
    return "\n".join(lines) + "\n"


def _busy_and_gaps(gpu: list[dict[str, Any]]) -> tuple[float, list[tuple[float, float]]]:
    """Microseconds the GPU had work (overlapping work counted once), and each stretch
    without any between its first and last work: (length, start)."""
    busy, gaps, end = 0.0, [], None
    for start, stop in sorted((e["ts"], e["ts"] + e["dur"]) for e in gpu):
        if end is None or start > end:
            if end is not None:
                gaps.append((start - end, end))
            busy += stop - start
            end = stop
        elif stop > end:
            busy += stop - end
            end = stop
    return busy, gaps


def _source(event: dict[str, Any], launch: str) -> str:
    if "GraphLaunch" in launch:
        return "CUDA graphs"
    if event["cat"] != "kernel":
        return "copies and sets"
    if "Kokkos" in event["name"]:
        return "Kokkos (LAMMPS, the pair style)"
    return "kernels launched one by one (torch)"
