"""Make a Kokkos 4.6/4.7 source tree build LAMMPS 2026 with CUDA 13 (idempotent).

    python tools/patch_kokkos.py KOKKOS_SRC

CUDA 13 changed two runtime signatures Kokkos's CUDA backend calls (a graph edge-data
argument; prefetch to a ``cudaMemLocation``), and LAMMPS 2026's KOKKOS package uses the
Kokkos 5 name ``UnorderedMap::host_mirror_type`` (Kokkos 4: ``HostMirror``). Kokkos 5
needs none of this: an edit whose original text is absent is skipped, and said so.
"""

from __future__ import annotations

import sys
from pathlib import Path

GRAPH_DEPENDENCIES = "return cudaGraphAddDependencies(graph, from, to, numDependencies);"
PREFETCH = "return cudaMemPrefetchAsync(devPtr, count, dstDevice, m_stream);"
HOST_MIRROR = (
    "  using HostMirror =\n      UnorderedMap<Key, Value, host_mirror_space, Hasher, EqualTo>;"
)

EDITS = {
    "core/src/Cuda/Kokkos_Cuda_Instance.hpp": {
        GRAPH_DEPENDENCIES: f"""#if CUDART_VERSION >= 13000
    return cudaGraphAddDependencies(graph, from, to, nullptr, numDependencies);
#else
    {GRAPH_DEPENDENCIES}
#endif""",
        PREFETCH: f"""#if CUDART_VERSION >= 13000
    cudaMemLocation location;
    location.type = dstDevice == cudaCpuDeviceId ? cudaMemLocationTypeHost
                                                 : cudaMemLocationTypeDevice;
    location.id = dstDevice == cudaCpuDeviceId ? 0 : dstDevice;
    return cudaMemPrefetchAsync(devPtr, count, location, 0, m_stream);
#else
    {PREFETCH}
#endif""",
    },
    "containers/src/Kokkos_UnorderedMap.hpp": {
        HOST_MIRROR: HOST_MIRROR + "\n  using host_mirror_type = HostMirror;",
    },
}


def apply(root: Path, edits: dict[str, dict[str, str]]) -> None:
    """Replace each original text by its edit, once; report what was done per edit."""
    for name, changes in edits.items():
        path = root / name
        text = before = path.read_text()
        for original, edited in changes.items():
            label = f"{name}: {original.split(chr(10))[0].strip()[:60]}"
            if edited in text:
                print(f"already patched  {label}")
            elif original in text:
                text = text.replace(original, edited, 1)
                print(f"patched          {label}")
            else:
                print(f"not needed       {label}")
        if text != before:  # an unchanged file keeps its time: a rerun rebuilds nothing
            path.write_text(text)


if __name__ == "__main__":
    apply(Path(sys.argv[1]), EDITS)
