"""The cut LAMMPS source that travels to GPU nodes without internet
(``tools/cut_lammps_source.sh``, docs/kokkos_build.md) and the KOKKOS build script's check of a
source tree's parts (``tools/build_lammps_kokkos.sh``), on small stand-in tarballs laid out
as Debian's (no top folder) and as a release's (one top folder).

A tree cut by hand without ``doc/lammps.1`` built for seven minutes on an H100 and then
failed in ``cmake --install``: the script now stops such a tree before it starts.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parents[1] / "tools"
BUILT = ["KOKKOS", "ML-IAP", "ML-SNAP", "PYTHON", "PLUGIN"]
KEPT = [
    "LICENSE",
    "cmake/CMakeLists.txt",
    "cmake/Modules/Packages/KOKKOS.cmake",
    "python/lammps/__init__.py",
    "doc/lammps.1",
    "src/lammps.cpp",
    "src/fmt/core.h",
    "src/nlohmann/json.hpp",
    *(f"src/{package}/{package.lower()}.cpp" for package in BUILT),
]
DROPPED = ["doc/src/Manual.rst", "examples/melt/in.melt", "src/MANYBODY/pair_tersoff.cpp"]


def source_tarball(tmp_path: Path, top: str, files: dict[str, str] | None = None) -> Path:
    tree = tmp_path / "tree"
    files = {name: f"{name}\n" for name in KEPT + DROPPED} | (files or {})
    for name, text in files.items():
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_text(text)
    tarball = tmp_path / "lammps.tar.gz"
    with tarfile.open(tarball, "w:gz") as archive:
        for path in sorted(tree.rglob("*")):
            if path.is_file():
                archive.add(path, arcname=str(Path(top, path.relative_to(tree))))
    return tarball


def tool(script: str, *args: Path | str, env: dict | None = None) -> subprocess.CompletedProcess:
    command = ["bash", str(TOOLS / script), *map(str, args)]
    return subprocess.run(command, check=False, capture_output=True, text=True, timeout=60, env=env)


def cut(source: Path, out: Path, *packages: str, styles: str = "") -> subprocess.CompletedProcess:
    env = {**os.environ, "KOKKOS_STYLES": styles} if styles else None
    return tool("cut_lammps_source.sh", source, out, *packages, env=env)


def build(source: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    kokkos = tmp_path / "kokkos"  # empty: the build must stop before it is read
    kokkos.mkdir(exist_ok=True)
    return tool("build_lammps_kokkos.sh", source, kokkos, tmp_path / "prefix", "SERIAL")


@pytest.mark.parametrize("top", ["", "lammps-22Jul2025"], ids=["debian", "release"])
def test_cut_keeps_what_the_build_reads(tmp_path: Path, top: str) -> None:
    out = tmp_path / "cut"
    result = cut(source_tarball(tmp_path, top), out)
    assert result.returncode == 0, result.stdout + result.stderr
    for name in KEPT:
        assert (out / name).read_text() == f"{name}\n", name
    for name in DROPPED:
        assert not (out / name).exists(), name
    # the build script's own check lets it through (it stops later, at the empty Kokkos)
    assert "has no" not in build(out, tmp_path).stderr


def test_cut_stops_on_a_missing_package(tmp_path: Path) -> None:
    result = cut(source_tarball(tmp_path, ""), tmp_path / "cut", "KOKKOS", "GPU")
    assert result.returncode != 0
    assert "no src/GPU" in result.stdout + result.stderr


def test_cut_stops_on_what_is_no_lammps_source(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    result = cut(tmp_path / "empty", tmp_path / "cut")
    assert result.returncode != 0
    assert "no LAMMPS source" in result.stdout + result.stderr


@pytest.mark.parametrize("missing", ["doc/lammps.1", "src/fmt", "src/ML-SNAP"])
def test_build_stops_at_once_without_a_part(tmp_path: Path, missing: str) -> None:
    out = tmp_path / "cut"
    assert cut(source_tarball(tmp_path, ""), out).returncode == 0
    if (out / missing).is_dir():
        shutil.rmtree(out / missing)
    else:
        (out / missing).unlink()
    result = build(out, tmp_path)
    assert result.returncode == 2
    assert f"has no {missing}" in result.stderr
    assert not (tmp_path / "prefix").exists()  # nothing started
    assert not (out / "lib" / "kokkos").exists()


#: KOKKOS variants: of core styles (pair_born, pair_lj_cut, fix_nh: named in KOKKOS.cmake),
#: of a package's style (pair_mliap) and of what is no style (atom_vec_atomic)
VARIANTS = {
    "src/pair_born.cpp": "",
    "src/pair_lj_cut.cpp": "",
    "src/fix_nh.cpp": "",
    "src/atom_vec_atomic.cpp": "",
    "src/ML-IAP/pair_mliap.cpp": "",
    "cmake/Modules/Packages/KOKKOS.cmake": "set(S ${DIR}/kokkos.cpp ${DIR}/fix_nh_kokkos.cpp)\n",
    **{
        f"src/KOKKOS/{style}_kokkos.{ext}": f"// {style}\n"
        for style in ("pair_born", "pair_lj_cut", "fix_nh", "atom_vec_atomic", "pair_mliap")
        for ext in ("cpp", "h")
    },
}


def test_cut_leaves_out_the_kokkos_variants_of_other_core_styles(tmp_path: Path) -> None:
    out = tmp_path / "cut"
    result = cut(source_tarball(tmp_path, "", VARIANTS), out, styles="pair_zero\n  pair_lj_cut\n")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "variants of 1 core styles" in result.stdout
    kept = sorted(path.name for path in (out / "src" / "KOKKOS").glob("*_kokkos.cpp"))
    assert kept == [
        f"{style}_kokkos.cpp"
        for style in ("atom_vec_atomic", "fix_nh", "pair_lj_cut", "pair_mliap")
    ]
    assert not (out / "src" / "KOKKOS" / "pair_born_kokkos.h").exists()
    # without KOKKOS_STYLES every variant stays
    assert cut(source_tarball(tmp_path, "", VARIANTS), out).returncode == 0
    assert (out / "src" / "KOKKOS" / "pair_born_kokkos.h").exists()


def test_cut_keeps_what_a_kept_variant_includes(tmp_path: Path) -> None:
    files = VARIANTS | {"src/KOKKOS/pair_lj_cut_kokkos.cpp": '#include "pair_born_kokkos.h"\n'}
    result = cut(source_tarball(tmp_path, "", files), tmp_path / "cut", styles="pair_lj_cut")
    assert result.returncode == 1
    assert "pair_lj_cut_kokkos.cpp includes pair_born_kokkos.h" in result.stdout


#: a package's variants that the cut leaves out by default (ML-SNAP's), with their headers
SNAP = {
    "src/ML-SNAP/pair_snap.cpp": "",
    **{
        f"src/KOKKOS/pair_snap_kokkos{suffix}": '#include "pair_snap_kokkos.h"\n'
        for suffix in (".cpp", ".h", "_impl.h")
    },
}


def test_cut_leaves_out_the_packages_variants_it_is_told_to(tmp_path: Path) -> None:
    source = source_tarball(tmp_path, "", VARIANTS | SNAP)
    out = tmp_path / "cut"
    result = cut(source, out, styles="pair_lj_cut")  # by default ML-SNAP's
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 core styles and 1 of packages" in result.stdout
    assert not list((out / "src" / "KOKKOS").glob("pair_snap_kokkos*"))
    assert (out / "src" / "KOKKOS" / "pair_mliap_kokkos.cpp").exists()
    # named: empty keeps them; a style without a variant is an error
    env = {**os.environ, "KOKKOS_STYLES": "pair_lj_cut", "KOKKOS_LEAVE_OUT": ""}
    assert tool("cut_lammps_source.sh", source, out, env=env).returncode == 0
    assert len(list((out / "src" / "KOKKOS").glob("pair_snap_kokkos*"))) == 3
    env["KOKKOS_LEAVE_OUT"] = "pair_snap pair_nothing"
    result = tool("cut_lammps_source.sh", source, out, env=env)
    assert result.returncode == 1
    assert "no KOKKOS variant of pair_nothing" in result.stdout
