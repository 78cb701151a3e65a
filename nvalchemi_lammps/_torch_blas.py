"""torch's own BLAS inside LAMMPS.

``liblammps.so`` exports a bundled reference BLAS and LAPACK (``dgemm_``, ``dgemv_``,
``dpotrf_``, ...). ``libtorch_cpu.so`` exports its optimized ones under the same names and
calls them through its own procedure linkage table, so a liblammps loaded before torch (the
``lmp`` executable links it; ``lammps.lammps()`` opens it ``RTLD_GLOBAL``) lends torch its
unoptimized float64 matrix multiply: about 10x slower, float32 unaffected. Opening
libtorch_cpu with ``RTLD_DEEPBIND`` before torch is imported makes it find its own symbols
first. This module imports no torch: the plugin calls :func:`load_torch` before importing
anything that does.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import sys
from pathlib import Path

import numpy as np

#: The library of torch that holds (and calls) BLAS.
TORCH_CPU = "libtorch_cpu.so"


def _torch_cpu_path() -> Path | None:
    """libtorch_cpu.so of the torch this interpreter would import, without importing it."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(spec.submodule_search_locations[0]) / "lib" / TORCH_CPU
    return path if path.is_file() else None


def _defined_globally(symbol: str) -> bool:
    return hasattr(ctypes.CDLL(None), symbol)


def load_torch() -> None:
    """Open libtorch_cpu so that it calls its own BLAS, when another library of the process
    (liblammps) already exports BLAS and torch is not imported yet; else do nothing (an
    imported torch was bound when it was loaded, ``RTLD_NOW``, before that library came)."""
    if sys.platform != "linux" or "torch" in sys.modules or not _defined_globally("dgemm_"):
        return
    path = _torch_cpu_path()
    if path is not None:
        ctypes.CDLL(str(path), mode=os.RTLD_NOW | os.RTLD_DEEPBIND)


class _DlInfo(ctypes.Structure):
    _fields_ = [
        ("dli_fname", ctypes.c_char_p),
        ("dli_fbase", ctypes.c_void_p),
        ("dli_sname", ctypes.c_char_p),
        ("dli_saddr", ctypes.c_void_p),
    ]


def _dladdr(address: int) -> _DlInfo:
    libc = ctypes.CDLL(None)
    libc.dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
    info = _DlInfo()
    if not libc.dladdr(address, ctypes.byref(info)):
        raise OSError(f"no shared object holds address {address:#x}")
    return info


def _plt_slot(path: Path, symbol: str) -> int:
    """Offset in ``path`` (an ELF64 little-endian shared object) of the slot its calls to
    ``symbol`` jump through (the ``R_X86_64_JUMP_SLOT`` / ``R_AARCH64_JUMP_SLOT`` entry)."""
    with open(path, "rb") as f:
        header = f.read(64)
        shoff = int.from_bytes(header[0x28:0x30], "little")
        shentsize = int.from_bytes(header[0x3A:0x3C], "little")
        shnum = int.from_bytes(header[0x3C:0x3E], "little")
        f.seek(shoff)
        sections = np.frombuffer(
            f.read(shentsize * shnum),
            dtype=np.dtype(
                [
                    ("name", "<u4"),
                    ("type", "<u4"),
                    ("flags", "<u8"),
                    ("addr", "<u8"),
                    ("offset", "<u8"),
                    ("size", "<u8"),
                    ("link", "<u4"),
                    ("info", "<u4"),
                    ("align", "<u8"),
                    ("entsize", "<u8"),
                ]
            ),
        )

        def read(section: np.void) -> bytes:
            f.seek(int(section["offset"]))
            return f.read(int(section["size"]))

        dynsym = sections[sections["type"] == 11][0]  # SHT_DYNSYM
        names = read(sections[dynsym["link"]])
        symbols = np.frombuffer(
            read(dynsym),
            dtype=np.dtype(
                [
                    ("name", "<u4"),
                    ("info", "u1"),
                    ("other", "u1"),
                    ("shndx", "<u2"),
                    ("value", "<u8"),
                    ("size", "<u8"),
                ]
            ),
        )
        name = names.find(b"\0" + symbol.encode() + b"\0") + 1
        index = np.nonzero(symbols["name"] == name)[0] if name > 0 else []
        rela = np.dtype([("offset", "<u8"), ("info", "<u8"), ("addend", "<i8")])
        for section in sections[sections["type"] == 4]:  # SHT_RELA
            relocations = np.frombuffer(read(section), dtype=rela)
            hit = np.isin(relocations["info"] >> 32, index)
            if hit.any():
                return int(relocations["offset"][hit][0])
    raise ValueError(f"{path} does not call {symbol}")


def blas_library(symbol: str = "dgemm_") -> str:
    """Path of the library whose ``symbol`` torch calls in this process (torch imported and
    ``symbol`` called at least once: a lazily bound slot still points at torch itself)."""
    path = _torch_cpu_path()
    if path is None:
        raise FileNotFoundError(f"torch's {TORCH_CPU} not found")
    own = ctypes.CDLL(str(path), mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    base = _dladdr(ctypes.cast(getattr(own, symbol), ctypes.c_void_p).value).dli_fbase
    target = ctypes.c_void_p.from_address(base + _plt_slot(path, symbol)).value
    return os.path.realpath(_dladdr(target).dli_fname.decode())
