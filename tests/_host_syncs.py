"""What a potential's forward and backward would make the host wait for on a GPU, found on
the CPU: the operations that torch's ``torch.cuda.set_sync_debug_mode`` flags (a value read
back to the host, a shape that depends on values) and those that copy host data to the
device, recorded by a dispatch mode while the potential runs on a padded graph as a
captured step runs it (tests/test_captured_long_range.py)."""

from __future__ import annotations

import dataclasses
import traceback

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from nvalchemi_lammps.contract import LocalGraph, Potential

aten = torch.ops.aten

#: Operations that wait for the device, whatever their arguments, and why.
_SYNCING = {
    aten._local_scalar_dense.default: "a value read back to the host (.item(), float(), bool())",
    aten.is_nonzero.default: "a value read back to the host (bool())",
    aten.equal.default: "a comparison read back to the host",
    aten.nonzero.default: "a shape that depends on values (nonzero)",
    aten.masked_select.default: "a shape that depends on values (masked_select)",
    aten.bincount.default: "a shape that depends on values (bincount)",
    aten._unique2.default: "a shape that depends on values (unique)",
    aten.unique_dim.default: "a shape that depends on values (unique)",
    aten.unique_consecutive.default: "a shape that depends on values (unique_consecutive)",
    aten._linalg_check_errors.default: "an error check read back to the host (torch.linalg)",
    aten.lift_fresh.default: "a tensor made from host data (a host-to-device copy)",
}

_INDEXING = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default}
_INDEXING.add(aten._index_put_impl_.default)
_REPEATING = {aten.repeat_interleave.Tensor, aten.repeat_interleave.self_Tensor}


#: Host reads of the CPU's implementation only, by the source line that makes them: their CUDA
#: path checks on the device instead (``one_hot`` with ``num_classes`` relies on the
#: device-side asserts of its scatter, ATen's ``Onehot.cpp``).
_CPU_ONLY = ("one_hot(",)


def _caller() -> traceback.FrameSummary:
    """The innermost frame outside torch and this module."""
    frames = traceback.extract_stack()[:-2]
    outside = [f for f in frames if "/torch/" not in f.filename and f.filename != __file__]
    return outside[-1]


def _why(func, args, kwargs) -> str | None:
    if func in _SYNCING:
        return _SYNCING[func]
    if func in _INDEXING:
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        if any(t is not None and t.dtype in (torch.bool, torch.uint8) for t in indices):
            return "a shape that depends on values (boolean-mask indexing)"
    if func in _REPEATING and kwargs.get("output_size") is None:
        return "a shape that depends on values (repeat_interleave without output_size)"
    return None


class HostSyncs(TorchDispatchMode):
    """Records every operation that would synchronize with the host on a GPU
    (``found``: ``operation: why``). ``tolist()`` reads a CPU tensor without dispatching
    and is not seen. A number assigned by indexing (``x[..., 0] = 1.0``) is lifted into a
    host scalar that only fills the device tensor: the fill takes the number on the host,
    nothing is copied, and it is not recorded.

    :param host: tensors that stay on the host also on a GPU (flags a model's modules read
        with ``.item()``): reading them waits for nothing
    """

    def __init__(self, host=()) -> None:
        super().__init__()
        self.found: list[str] = []
        self.host = {id(t) for t in host}
        #: scalars lifted from host numbers, by id (kept alive: ids stay unique), and the
        #: record each made, withdrawn when the scalar only fills a tensor
        self._lifted: dict[int, tuple[torch.Tensor, str]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is aten.fill_.Tensor and id(args[1]) in self._lifted:
            self.found.remove(self._lifted.pop(id(args[1]))[1])
        why = _why(func, args, kwargs)
        if func is aten._local_scalar_dense.default and id(args[0]) in self.host:
            why = None
        record = None
        if why is not None:
            caller = _caller()
            if not any(call in (caller.line or "") for call in _CPU_ONLY):
                where = f"{caller.filename.rsplit('/', 1)[-1]}:{caller.lineno}"
                record = f"{func} at {where} ({caller.line}): {why}"
                self.found.append(record)
        out = func(*args, **kwargs)
        if func is aten.lift_fresh.default and record is not None and out.dim() == 0:
            self._lifted[id(out)] = (out, record)
        return out


def padded_graph(
    graph: LocalGraph, cutoff: float, owned_padding: int = 3, pair_padding: int = 7
) -> tuple[LocalGraph, torch.Tensor]:
    """``graph`` padded as a captured step pads it (engine/_padding.py): ``owned_padding``
    owned rows of species -1 (at the origin, no charge) after the owned rows, as many ghost
    padding rows after the ghosts, and ``pair_padding`` pairs spread over the owned padding
    rows, each joining a row to itself with a vector longer than the cutoff; ghosts
    exchanged by owned row on one rank as ``graph.comm`` exchanges. And the padded rows of
    the graph's rows."""
    from _systems import OneRankComm

    nlocal, ntotal = graph.nlocal, graph.ntotal
    owned = nlocal + owned_padding
    rows = torch.arange(ntotal)
    rows[nlocal:] += owned_padding
    atoms = ntotal + 2 * owned_padding

    def laid_out(t: torch.Tensor | None, fill: float) -> torch.Tensor | None:
        if t is None:
            return None
        out = t.new_full((atoms, *t.shape[1:]), fill)
        out[rows] = t
        return out

    ends = nlocal + torch.arange(pair_padding) % owned_padding
    far = graph.rij.new_zeros(pair_padding, 3)
    far[:, 0] = 2.0 * cutoff + 1.0
    owners = torch.arange(atoms)
    owners[rows] = rows[graph.comm.local_owners(torch.device("cpu"))]
    padded = dataclasses.replace(
        graph,
        nlocal=owned,
        species=laid_out(graph.species, -1),
        pair_i=torch.cat([rows[graph.pair_i], ends]),
        pair_j=torch.cat([rows[graph.pair_j], ends]),
        rij=torch.cat([graph.rij, far]),
        comm=OneRankComm(owners.numpy(), graph.comm.exchange),
        positions=laid_out(graph.positions, 0.0),
        charges=laid_out(graph.charges, 0.0),
    )
    return padded, rows


def host_syncs(
    potential: Potential, graph: LocalGraph, host=(), capturing: bool = True
) -> tuple[list[str], torch.Tensor]:
    """The host synchronizations of ``potential`` (prepared for capture) run forward and
    backward on ``graph`` (one rank, ``graph.comm`` a ``_systems.OneRankComm``) padded as a
    captured step pads it (:func:`padded_graph`), with the checks that run outside a
    capture left out (``capturing()`` true; ``capturing=False``: run as outside a capture,
    checks included); and the energies of the graph's rows. Inputs are cast to the
    potential's dtype first, as the engine casts them. ``host``: tensors that stay on the
    host on a GPU (:class:`HostSyncs`)."""
    from nvalchemi_lammps.potentials import _capture

    inner = potential.prepare_capture()
    dtype = potential.spec.torch_dtype
    graph = dataclasses.replace(
        graph,
        rij=graph.rij.to(dtype),
        positions=None if graph.positions is None else graph.positions.to(dtype),
        cell=None if graph.cell is None else graph.cell.to(dtype),
    )
    layout, rows = padded_graph(graph, potential.spec.cutoff)
    leaves = {"rij": layout.rij.detach().clone().requires_grad_(True)}
    if layout.positions is not None:
        leaves["positions"] = layout.positions.detach().clone().requires_grad_(True)
        leaves["cell"] = layout.cell.detach().clone().requires_grad_(True)
    layout = dataclasses.replace(layout, **leaves)
    weights = (torch.arange(layout.ntotal) < layout.nlocal).to(dtype)  # the owned rows' sum
    mode = HostSyncs(host)
    outside, _capture.capturing = _capture.capturing, lambda: capturing
    try:
        with mode, torch.autograd.set_multithreading_enabled(False):
            energies = inner(layout)
            grads = weights.to(energies.dtype)
            torch.autograd.grad(energies, list(leaves.values()), grads, allow_unused=True)
    finally:
        _capture.capturing = outside
    return mode.found, energies.detach()[rows]
