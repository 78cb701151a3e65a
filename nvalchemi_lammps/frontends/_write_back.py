"""What every front door does with an :class:`~nvalchemi_lammps.engine.Evaluation`: the
per-atom forces and virials it implies, and, when it is not finite, the one report that
names the atoms (by ID) and the step.

Pair forces act as LAMMPS's pair styles apply them, ``f[i] += fij`` and ``f[j] -= fij``;
ghost rows are left for LAMMPS's reverse communication (``newton pair on``).
"""

from __future__ import annotations

import torch

from ..engine import Evaluation

__all__ = ["SHOWN", "add_forces", "nonfinite_positions", "nonfinite_report", "pair_virials"]

#: atom IDs named in a report about non-finite values
SHOWN = 8


def add_forces(
    forces: torch.Tensor, pair_i: torch.Tensor, pair_j: torch.Tensor, result: Evaluation
) -> None:
    """Add ``result``'s forces to the ``(ntotal, 3)`` ``forces`` in place: each pair's
    ``fij`` onto ``i`` and ``-fij`` onto ``j``, then the per-atom forces of terms that are
    not pairwise (if any), cast to ``forces``'s device and dtype."""
    pair_forces = result.pair_forces.to(device=forces.device, dtype=forces.dtype)
    forces.index_add_(0, pair_i, pair_forces)
    forces.index_add_(0, pair_j, pair_forces, alpha=-1.0)
    if result.atom_forces is not None:
        forces += result.atom_forces.to(device=forces.device, dtype=forces.dtype)


def pair_virials(rij: torch.Tensor, pair_forces: torch.Tensor) -> torch.Tensor:
    """Each pair's virial ``(x_i - x_j) (x) f_i = -rij (x) fij``, ``(npairs, 6)`` as ``xx yy
    zz xy xz yz`` (LAMMPS's ``ev_tally_xyz``, which puts half onto ``i`` and half onto
    ``j``)."""
    d, fij = -rij, pair_forces.to(rij.device)
    return torch.stack(
        (
            d[:, 0] * fij[:, 0],
            d[:, 1] * fij[:, 1],
            d[:, 2] * fij[:, 2],
            d[:, 0] * fij[:, 1],
            d[:, 0] * fij[:, 2],
            d[:, 1] * fij[:, 2],
        ),
        dim=1,
    )


def nonfinite_report(
    model: str,
    result: Evaluation,
    tags: torch.Tensor,
    pair_i: torch.Tensor,
    pair_j: torch.Tensor,
    rij: torch.Tensor,
    positions: torch.Tensor | None,
    step: int | None = None,
) -> str:
    """What to say when ``result`` is not finite (computed only then, so the search costs
    nothing per step): atoms whose positions are not finite (they drop out of every pair,
    so only the positions show them), else two atoms on the same spot (the usual cause of a
    model's infinities), else the atoms whose energy or force is not finite.

    :param model: the model as named in messages (``Session.model_name``)
    :param tags: ``(ntotal,)`` atom IDs of the rows
    :param pair_i: ``(npairs,)`` rows of the evaluated pairs' receivers
    :param pair_j: ``(npairs,)`` rows of their neighbors
    :param rij: ``(npairs, 3)`` the evaluated pairs' vectors
    :param positions: ``(ntotal, 3)`` positions of the rows, or ``None``
    :param step: LAMMPS's step, or ``None`` where the caller's message names it
    """
    at = "" if step is None else f" at step {step}"
    tags = tags.long()
    if positions is not None:
        report = nonfinite_positions(model, tags, positions, at)
        if report is not None:
            return report
    same = (rij == 0).all(dim=1).nonzero()[:, 0]
    if same.numel():
        k = int(same[0])
        i, j = int(pair_i[k]), int(pair_j[k])
        where = " ".join(str(float(v)) for v in positions[i]) if positions is not None else ""
        return (
            f"atoms {int(tags[i])} and {int(tags[j])} are on the same spot"
            + (f" ({where})" if where else "")
            + f"{at}, where {model} gives no finite energy"
        )
    rows = []
    if result.atom_energies is not None:
        rows.append((~torch.isfinite(result.atom_energies)).nonzero()[:, 0])
    forces = result.pair_forces if result.pair_forces is not None else result.pair_scalars
    if forces is not None:
        bad = ~torch.isfinite(forces.reshape(forces.shape[0], -1)).all(dim=1)
        rows += [pair_i[bad.to(pair_i.device)], pair_j[bad.to(pair_j.device)]]
    if result.atom_forces is not None:
        rows.append((~torch.isfinite(result.atom_forces).all(dim=1)).nonzero()[:, 0])
    rows = torch.cat([r.to(tags.device) for r in rows]) if rows else tags[:0]
    named = _named(tags, rows)
    return f"{model} returned non-finite energies or forces{at}" + (
        f" on atoms {named}"
        if named
        else " (each value is finite: their sum overflows, or the virial is not finite)"
    )


def nonfinite_positions(
    model: str, tags: torch.Tensor, positions: torch.Tensor, at: str = ""
) -> str | None:
    """The atoms (by ID) whose position is not finite, as :func:`nonfinite_report` names
    them (``at``: where, as " at step N"), or ``None`` when every position is finite."""
    rows = (~torch.isfinite(positions).all(dim=1)).nonzero()[:, 0]
    if not rows.numel():
        return None
    named = _named(tags.long(), rows)
    atoms = "atoms" if " " in named else "atom"
    return (
        f"{atoms} {named} with a non-finite position{at} (NaN or infinite, as after a "
        f"NaN velocity or force): such an atom drops out of every pair of {model}"
    )


def _named(tags: torch.Tensor, rows: torch.Tensor) -> str:
    """The distinct IDs of ``rows``, ascending, the first :data:`SHOWN` of them."""
    ids = sorted({int(t) for t in tags.index_select(0, rows.to(tags.device)).cpu()})
    named = " ".join(str(t) for t in ids[:SHOWN])
    if len(ids) > SHOWN:
        named += f" ... ({len(ids)} atoms)"
    return named
