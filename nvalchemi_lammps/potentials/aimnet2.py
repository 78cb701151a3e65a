"""AIMNet2 (the ``aimnet`` package) on a LocalGraph, its charge equilibration summed over ranks.

The potential runs the modules of an ``aimnet.models.AIMNet2`` itself, in the order of its own
``forward_prepared``: the element embedding, the AEV of every pair (``AEVSV._calc_aev``), then
per pass the convolutions of atom features and charges (``ConvSV``) and an MLP whose output
updates the charges and the features, and after the last pass the output heads. The graph's
directed pairs are handed to aimnet's modules in aimnet's own "mode 1" layout (a padded
neighbor matrix, one row per atom, and a dummy last atom that padding points to), so the
convolutions are aimnet's, CUDA kernel included; the matrix is filled from ``pair_i``,
``pair_j``, ``rij`` and no neighbor search is done here.

What differs from aimnet, and why:

- charge equilibration (``aimnet.ops.nse``) spreads each pass's charge excess over the whole
  system: its two sums (``mol_sum`` of the raw charges and of the weights) run over owned
  atoms only and are added up over ranks with ``graph.comm.allreduce``; the net charge is
  ``graph.total_charge`` (``pair_style nvalchemi ... charge Q``);
- after every pass but the last the updated features and charges go through
  ``graph.comm.forward_exchange``, so that ghost rows hold their owners' values for the next
  pass's convolutions (the identity under the widened ghost shell, where ghosts compute their
  own): ``layers`` is the number of passes;
- only the rows that receive pairs are computed: under the exchange no ghost receives one,
  and the AEV, convolutions, MLPs and heads run on the owned rows only (the senders' values
  read from the table of all rows); under the widened shell every row is computed;
- captured as CUDA graphs (``pair_style nvalchemi ... capture``), on graphs padded to
  capacities, the neighbor matrix's width is one of them (``LocalGraph.row_pairs``, which
  the engine fixes and grows: :attr:`Potential.pairs_by_row`), the rows computed follow
  the strategy (``graph.comm.exchange``) instead of the pairs, and nothing is read back
  from the GPU: aimnet's modules read only their neighbor mode, a host tensor;
- per-atom energies are returned instead of aimnet's per-system sum (``AtomicSum``);
- the long-range heads are dropped: ``LRCoulomb`` (aimnet's Coulomb energy of the predicted
  charges) and ``DFTD3``/``D3TS`` (dispersion). Pipelines of this package add Ewald/PME and
  DFT-D3 as terms of their own; :meth:`AIMNet2.outputs` provides the charges for that.
  ``SRCoulomb`` (which removes the short-range Coulomb part a model learned, for use with an
  external full Coulomb term) is kept, evaluated per pair.

aimnet is an optional dependency (``pip install 'nvalchemi-lammps[toolkit]'``), imported only
when an AIMNet2 model is built. Spin-polarized models (two charge channels) are refused.
AIMNet2 is trained in float32, the default here; ``dtype = "float64"`` casts the weights, for
checks of exactness. Per-element energy shifts stay in float64, as aimnet keeps them, so the
energies come back in float64 whatever the dtype.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from .._quiet import without_warp_banner
from ..contract import LocalGraph, ModelSpec, check_keys
from ._base import Potential, register_potential
from ._charge import checked_total_charge

_DTYPES = {"float32": torch.float32, "float64": torch.float64}

#: aimnet's flags of the layout handed to its modules (neighbor mode 1, padded input): host
#: tensors, which its modules read with ``.item()`` without waiting for the GPU, made once
#: (a tensor made from host data in the forward would be a copy to the GPU)
HOST_FLAGS = {"_nb_mode": torch.tensor(1), "_input_padded": torch.tensor(True)}

#: Element symbols of atomic numbers 1..63: AIMNet2 embeds elements up to Z = 63.
# fmt: off
SYMBOLS = (
    "H", "He", "Li", "Be", "B", "C", "N", "O", "F", "Ne", "Na", "Mg", "Al", "Si", "P", "S",
    "Cl", "Ar", "K", "Ca", "Sc", "Ti", "V", "Cr", "Mn", "Fe", "Co", "Ni", "Cu", "Zn", "Ga", "Ge",
    "As", "Se", "Br", "Kr", "Rb", "Sr", "Y", "Zr", "Nb", "Mo", "Tc", "Ru", "Rh", "Pd", "Ag", "Cd",
    "In", "Sn", "Sb", "Te", "I", "Xe", "Cs", "Ba", "La", "Ce", "Pr", "Nd", "Pm", "Sm", "Eu",
)
# fmt: on

#: Output heads of an aimnet model, by class name: evaluated here, or dropped (module doc).
KEPT_OUTPUTS = ("Output", "AtomicShift", "AtomicSum", "SRCoulomb")
DROPPED_OUTPUTS = ("LRCoulomb", "DFTD3", "D3TS")


_INSTALL_HINT = (
    "the aimnet2 potential needs aimnet: pip install 'nvalchemi-lammps[toolkit]' "
    "(or pip install aimnet)"
)

_AIMNET: Any = None


def _aimnet() -> Any:
    """The ``aimnet`` package, imported once.

    Importing it initializes Warp, which prints a banner to stdout: that banner is dropped,
    anything else printed is kept.
    """
    global _AIMNET
    if _AIMNET is not None:
        return _AIMNET
    try:
        with without_warp_banner():
            import aimnet
            import aimnet.config
            import aimnet.models
            import aimnet.models.artifact_validation
            import aimnet.models.base
            import aimnet.models.utils
            import aimnet.modules
            import aimnet.nbops
    except ImportError as err:
        raise ImportError(f"{_INSTALL_HINT} ({err})") from err
    _AIMNET = aimnet
    return _AIMNET


def packaged_config() -> dict[str, Any]:
    """aimnet's packaged ``aimnet2.yaml`` (the AIMNet2 architecture) as plain data, without
    its long-range Coulomb head."""
    import yaml

    aimnet = _aimnet()
    path = Path(aimnet.models.__file__).parent / "aimnet2.yaml"
    config = yaml.safe_load(path.read_text())
    config["kwargs"]["outputs"].pop("lrcoulomb", None)
    return config


def _without_dropped(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` without the output heads this module drops; other unknown heads refused."""
    config = copy.deepcopy(config)
    outputs = config.get("kwargs", {}).get("outputs", {})
    if not isinstance(outputs, dict):
        raise ValueError(  # noqa: TRY004 - a bad configuration value
            "AIMNet2 configuration: outputs must be a table of named heads"
        )
    for key in list(outputs):
        kind = str(outputs[key].get("class", "")).rsplit(".", 1)[-1]
        if kind in DROPPED_OUTPUTS:
            del outputs[key]
        elif kind not in KEPT_OUTPUTS:
            raise ValueError(
                f"AIMNet2 output head {key} of class {kind} is not supported "
                f"(supported: {', '.join(KEPT_OUTPUTS)}; dropped: {', '.join(DROPPED_OUTPUTS)})"
            )
    return config


def build_model(config: dict[str, Any]) -> torch.nn.Module:
    """An ``aimnet.models.AIMNet2`` from its configuration (random weights; the random
    initialization leaves torch's generator alone). Only classes aimnet itself trusts when
    it loads model files may be named.

    :raises ValueError: another model class, or a spin-polarized model
    """
    aimnet = _aimnet()
    if str(config.get("class", "")).rsplit(".", 1)[-1] != "AIMNet2":
        raise ValueError(
            f"unsupported aimnet model class {config.get('class')} (supported: AIMNet2)"
        )
    policy = aimnet.models.artifact_validation.resolve_model_import_policy(None, "extend")
    with torch.random.fork_rng(devices=[]), torch.device("cpu"):
        model = aimnet.config.build_module(
            copy.deepcopy(config),
            allow_file_references=False,
            import_authorizer=policy.require_allowed,
        )
    if model.num_charge_channels != 1:
        raise ValueError("spin-polarized AIMNet2 models (two charge channels) are not supported")
    return model


# --- the potential -------------------------------------------------------------------------


@register_potential
class AIMNet2(Potential):
    """An aimnet ``AIMNet2`` model (closed shell) without its long-range heads.

    Per-atom energy = the energy head's output from the atom's final features, plus its
    element's shift, minus the atom's share of the short-range Coulomb energy where the model
    has ``SRCoulomb``. Charges are equilibrated to ``graph.total_charge`` over the whole
    system. Energies in eV, lengths in Angstrom (``units metal``); the cutoff is the AEV's
    ``rc_s``; ``layers`` is the number of passes.

    Build one with random weights from aimnet's packaged architecture with
    :meth:`random_weights`, or from an aimnet model file with :meth:`from_checkpoint`; the
    constructor takes :meth:`config`'s plain data.

    :param model: aimnet model configuration as plain data (``class`` and ``kwargs``, as in
        aimnet's ``aimnet2.yaml``); long-range heads are dropped
    :param elements: element symbols the model is used for, in model order
    :param dtype: ``float32`` (default, as AIMNet2 is trained) or ``float64``
    """

    name = "aimnet2"
    pairs_by_row = True

    def __init__(self, model: dict[str, Any], elements: list[str], dtype: str = "float32") -> None:
        super().__init__()
        if dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(_DTYPES)}; got '{dtype}'")
        elements = list(elements)
        unknown = [e for e in elements if e not in SYMBOLS]
        if unknown:
            raise ValueError(
                f"element(s) {', '.join(unknown)} not in AIMNet2, which embeds elements "
                f"{SYMBOLS[0]}..{SYMBOLS[-1]} (Z = 1..{len(SYMBOLS)})"
            )
        config = _without_dropped(model)
        network = build_model(config).to(_DTYPES[dtype]).eval()
        _aimnet().models.utils.convert_atomic_shifts_to_float64(network)
        for parameter in network.parameters():
            parameter.requires_grad_(False)
        self.model = network
        self.register_buffer(
            "atomic_numbers",
            torch.tensor([SYMBOLS.index(e) + 1 for e in elements], dtype=torch.int64),
            persistent=False,
        )
        self.spec = ModelSpec(
            elements=tuple(elements),
            cutoff=float(network.aev.rc_s),
            units="metal",
            dtype=dtype,
            layers=len(network.mlps),
        )
        self._config = {"model": config, "elements": elements, "dtype": dtype}

    def config(self) -> dict[str, Any]:
        return copy.deepcopy(self._config)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        result = super().load_state_dict(state_dict, strict=strict, assign=assign)
        self.check_elements()
        return result

    def check_elements(self) -> None:
        """Every element has a finite embedding (aimnet fills the rows of elements a model
        was not trained on with NaN).

        :raises ValueError: naming the elements the weights do not cover
        """
        rows = self.model.afv.weight[self.atomic_numbers]
        missing = [
            e for e, ok in zip(self.spec.elements, torch.isfinite(rows).all(dim=1)) if not ok
        ]
        if missing:
            raise ValueError(f"element(s) {', '.join(missing)} not in this AIMNet2 model")

    @classmethod
    def random_weights(
        cls,
        elements: list[str],
        seed: int = 0,
        dtype: str = "float32",
        model: dict[str, Any] | None = None,
    ) -> AIMNet2:
        """AIMNet2 with random weights drawn with ``seed`` (for tests and benchmarks).

        :param model: architecture (default: aimnet's packaged ``aimnet2.yaml``)
        """
        config = packaged_config() if model is None else model
        # the constructor draws the weights from torch's generator, forked: seed the fork
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return cls(config, elements, dtype=dtype)

    @classmethod
    def from_checkpoint(
        cls, path: str | Path, elements: list[str] | None = None, dtype: str = "float32"
    ) -> AIMNet2:
        """Load an aimnet model file (format 2, ``*.pt``: a configuration and weights, read
        with ``torch.load(weights_only=True)``; legacy TorchScript ``*.jpt`` files are not
        supported).

        :param elements: element symbols to use (default: every element the model implements)
        """
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"AIMNet2 model file {path} not found")
        if path.suffix.lower() == ".jpt":
            raise ValueError(
                f"{path}: legacy TorchScript AIMNet2 files are not supported; use a format-2 "
                "*.pt model file (aimnet's model registry provides them)"
            )
        aimnet = _aimnet()
        policy = aimnet.models.artifact_validation.resolve_model_import_policy(None, "extend")
        data = torch.load(path, map_location="cpu", weights_only=True)
        try:
            config, state = aimnet.models.artifact_validation.validate_v2_artifact_with_policy(
                data, policy
            )
        except (ValueError, TypeError, KeyError) as err:
            raise ValueError(f"{path} is not an aimnet model file: {err}") from None
        if elements is None:
            species = data.get("implemented_species") or []
            elements = [SYMBOLS[z - 1] for z in species if 1 <= z <= len(SYMBOLS)]
        potential = cls(_plain(config), elements, dtype=dtype)
        state = dict(state)
        for key, value in potential.model.state_dict().items():
            if key in state:
                state[key] = state[key].to(value.dtype)
        dropped = {k for k in state if k not in potential.model.state_dict()}
        heads = tuple(f"outputs.{k}." for k in _dropped_heads(config))
        stray = sorted(k for k in dropped if not k.startswith(heads))
        if stray:
            raise ValueError(f"{path}: weights the AIMNet2 model does not have: {stray[:5]}")
        potential.model.load_state_dict({k: v for k, v in state.items() if k not in dropped})
        potential.check_elements()
        return potential

    @classmethod
    def from_export_config(cls, config: dict[str, Any]) -> AIMNet2:
        """What ``nvalchemi-lammps export`` builds from a TOML file with
        ``potential = "aimnet2"``: ``checkpoint`` (an aimnet ``*.pt`` model file) or ``seed``
        (random weights from aimnet's packaged architecture), ``elements`` (required with
        ``seed``), ``dtype``.
        """
        check_keys(config, "potential aimnet2", ("checkpoint", "seed", "elements", "dtype"))
        if ("checkpoint" in config) == ("seed" in config):
            raise ValueError(
                'potential aimnet2 needs either checkpoint = "<aimnet model file>" or '
                "seed = <integer> (random weights)"
            )
        dtype = config.get("dtype", "float32")
        try:
            if "checkpoint" in config:
                return cls.from_checkpoint(config["checkpoint"], config.get("elements"), dtype)
            if "elements" not in config:
                raise ValueError("potential aimnet2 with random weights needs key elements")
            return cls.random_weights(config["elements"], int(config["seed"]), dtype)
        except ImportError as err:  # the CLI reports ValueErrors as one line
            raise ValueError(str(err)) from None

    def prepare_capture(self) -> AIMNet2:
        """Itself: on a padded graph, whose ``row_pairs`` fixes the neighbor matrix's
        width (the engine's capacity, :attr:`pairs_by_row`), nothing is read back from the
        GPU and padding is inert (species -1: no features, no energy; padding pairs beyond
        the cutoff: zero AEV, and those a padding row receives beyond the width dropped)."""
        return self

    # --- evaluation ------------------------------------------------------------------------

    def forward(self, graph: LocalGraph) -> torch.Tensor:
        return self.outputs(graph)["energies"]

    predicts = ("energies", "charges")

    def outputs(self, graph: LocalGraph) -> dict[str, torch.Tensor]:
        """Per-atom ``energies`` and ``charges`` (both ``(ntotal,)``) of every row.

        Energies are right for owned rows (the engine sums those; ghost rows hold zero, or
        their own under the widened shell); charges for every row: ghost rows hold their
        owners' charges, or their own under the widened shell.
        """
        return _evaluate(self.model, graph, self.atomic_numbers, self.spec.torch_dtype)


def _plain(config: Any) -> Any:
    """A configuration read from a model file as JSON-like plain data."""
    if isinstance(config, dict):
        return {str(k): _plain(v) for k, v in config.items()}
    if isinstance(config, list | tuple):
        return [_plain(v) for v in config]
    return config


def _dropped_heads(config: dict[str, Any]) -> list[str]:
    outputs = config.get("kwargs", {}).get("outputs", {})
    return [
        k
        for k, v in outputs.items()
        if str(v.get("class", "")).rsplit(".", 1)[-1] in DROPPED_OUTPUTS
    ]


def _computed_rows(graph: LocalGraph) -> int:
    """``m``: the passes compute rows ``0..m-1``, the rows that receive pairs. That is the
    owned rows when no ghost receives a pair (``strategy exchange``: the ghosts' features and
    charges then come from their owners), else every row (the widened shell, where ghosts
    compute their own). On a graph of fixed shapes (``row_pairs`` given: a padded graph)
    the strategy decides, not the pairs: the owned rows under the exchange, where no ghost
    receives a pair; every row without it, where every ghost that sends one receives."""
    if graph.row_pairs is not None:
        return graph.nlocal if graph.comm.exchange else graph.ntotal
    if graph.npairs == 0 or int(graph.pair_i.max()) < graph.nlocal:
        return graph.nlocal
    return graph.ntotal


def _mode1_inputs(graph: LocalGraph, m: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """aimnet's flat "mode 1" layout of rows ``0..m-1`` of ``graph`` (:func:`_computed_rows`)
    and a dummy last row; ``nbmat[i]`` lists the senders of the pairs received by row ``i``,
    as rows of the whole table (``0..ntotal-1``, ghosts included), padded with the table's
    dummy row ``ntotal``; ``r_ij`` holds the pair vectors (padding: 1, as aimnet pads).

    The width is the most pairs a row receives, or ``graph.row_pairs`` where given (fixed
    shapes): then pairs beyond it, which only padding rows receive (beyond the cutoff),
    go to one more column, dropped."""
    n, device = graph.ntotal, graph.species.device
    order = torch.argsort(graph.pair_i, stable=True)
    receiver, sender = graph.pair_i[order], graph.pair_j[order]
    counts = torch.zeros(m + 1, dtype=torch.int64, device=device)
    counts = counts.index_add_(0, receiver, torch.ones_like(receiver))
    starts = torch.cumsum(counts, 0) - counts
    slot = torch.arange(graph.npairs, device=device) - starts[receiver]
    if graph.row_pairs is None:
        width, spill = (int(counts.max()) if graph.npairs else 0), 0
    else:
        width, spill = graph.row_pairs, 1
        slot = slot.clamp(max=width)
    nbmat = torch.full((m + 1, width + spill), n, dtype=torch.int64, device=device)
    nbmat[receiver, slot] = sender
    r_ij = torch.ones(m + 1, width + spill, 3, dtype=dtype, device=device)
    r_ij = r_ij.index_put((receiver, slot), graph.rij[order].to(dtype))
    if spill:
        nbmat, r_ij = nbmat[:, :width].contiguous(), r_ij[:, :width]
    return {
        "nbmat": nbmat,
        "r_ij": r_ij,
        "mask_ij": nbmat == n,
        "mask_i": torch.arange(m + 1, device=device) == m,
        **HOST_FLAGS,
    }


def _evaluate(
    model: torch.nn.Module, graph: LocalGraph, atomic_numbers: torch.Tensor, dtype: torch.dtype
) -> dict[str, torch.Tensor]:
    """``AIMNet2.forward_prepared`` on one rank's graph (module docstring).

    Two tables of ``ntotal + 1`` rows (every atom and a dummy) hold the atoms' features and
    charges, which the convolutions read for the senders; the AEV, the convolutions, the
    MLPs and the heads run on the computed rows only (:func:`_computed_rows`), in aimnet's
    layout of those rows (:func:`_mode1_inputs`). ``rows(x)`` picks them out of a table.
    """
    n, nlocal = graph.ntotal, graph.nlocal
    m = _computed_rows(graph)

    def rows(table: torch.Tensor) -> torch.Tensor:
        return table if m == n else torch.cat([table[:m], table[n:]])

    mapped = graph.species >= 0
    numbers = torch.where(mapped, atomic_numbers[graph.species.clamp(min=0)], 0)
    numbers = torch.cat([numbers, numbers.new_zeros(1)])
    data = _mode1_inputs(graph, m, dtype)
    data["numbers"] = rows(numbers)
    r_ij = data.pop("r_ij")
    d_ij = torch.linalg.vector_norm(r_ij, dim=-1)
    data["d_ij"] = d_ij
    data["g_sv"] = model.aev._calc_aev(r_ij, d_ij, data)
    # atoms the passes update: not the dummy, not NULL types (no pairs, zero features)
    real = rows(torch.cat([mapped, mapped.new_zeros(1)]))[:, None]
    total = d_ij.new_full((), checked_total_charge(graph.total_charge))

    table_a = model.afv(numbers)  # the element embedding: the first pass's features
    if model.d2features:
        table_a = table_a.unflatten(-1, (model.nfeature, model.nshifts_s))
    table_q = None
    last = len(model.mlps) - 1
    for ipass, mlp in enumerate(model.mlps):
        inputs = _prepare_in(model.conv_a, data, table_a, rows)
        if ipass > 0:
            inputs = torch.cat([inputs, _prepare_in(model.conv_q, data, table_q, rows)], dim=-1)
        out = torch.where(real, mlp(inputs), 0.0)
        if ipass == last:
            data["aim"] = out
            break
        raw, weight, delta = out.split([1, 1, out.shape[-1] - 2], dim=-1)
        charges = raw if table_q is None else rows(table_q) + raw
        charges = _equilibrate(charges, weight.pow(2), total, nlocal, graph)
        own = rows(table_a)
        features = own + delta.view_as(own)
        # ghosts take their owners' features and charges for the next pass's convolutions;
        # rows m..ntotal-1, not computed, are zero until the exchange fills them
        table = torch.cat([features[:m].flatten(1), charges[:m]], dim=1)
        if m < n:
            table = torch.cat([table, table.new_zeros(n - m, table.shape[1])])
        table = graph.comm.forward_exchange(table)
        width = table.shape[1] - 1
        table_a = torch.cat([table[:, :width].reshape(-1, *features.shape[1:]), features[m:]])
        table_q = torch.cat([table[:, width:], charges[m:]])

    table_q = table_q.squeeze(-1)
    data["a"], data["charges"] = rows(table_a), rows(table_q)
    energies = torch.zeros(m + 1, dtype=torch.float64, device=d_ij.device)
    for head in model.outputs.children():
        kind = type(head).__name__
        if kind == "Output":
            energies = energies + head.mlp(data[head.key_in]).squeeze(-1).double()
        elif kind == "AtomicShift":
            energies = energies + head.shifts(data["numbers"]).squeeze(-1).double()
        elif kind == "SRCoulomb":
            fixed = graph.row_pairs is not None
            energies = energies - _short_range_coulomb(head, data, table_q, fixed)
        # AtomicSum: the engine sums the owned rows
    energies = torch.where(real[:, 0], energies, 0.0)[:m]
    if m < n:  # ghost rows: no energy computed (the engine reads owned rows only)
        energies = torch.cat([energies, energies.new_zeros(n - m)])
    return {"energies": energies, "charges": table_q[:n]}


def _prepare_in(
    conv: torch.nn.Module,
    data: dict[str, torch.Tensor],
    table: torch.Tensor,
    rows: Callable[[torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """aimnet's ``AIMNet2._prepare_in_a`` (``conv_a``, ``table`` the features) or
    ``_prepare_in_q`` (``conv_q``, the charges), their operations in the same order, with the
    receivers' own values picked out of the table by ``rows`` and the senders' read from the
    whole table."""
    own = _aimnet().nbops.get_i(rows(table), data)
    around = conv(data, table)
    if own.ndim == 4:  # d2features
        own = own.flatten(-2, -1)
    return torch.cat([own.squeeze(-2), around], dim=-1)


def _equilibrate(
    charges: torch.Tensor,
    weights: torch.Tensor,
    total: torch.Tensor,
    nlocal: int,
    graph: LocalGraph,
) -> torch.Tensor:
    """``aimnet.ops.nse`` with its two sums over the whole system: owned rows, summed over
    ranks (one all-reduce). The excess charge goes to every atom in proportion to its weight."""
    local = torch.cat([weights[:nlocal].sum(0), charges[:nlocal].sum(0)])
    weight_sum, charge_sum = graph.comm.allreduce(local).unbind(0)
    return charges + weights / (weight_sum + 1.0e-6) * (total - charge_sum)


def _short_range_coulomb(
    head: torch.nn.Module, data: dict[str, torch.Tensor], table_q: torch.Tensor, fixed: bool
) -> torch.Tensor:
    """Per-atom share of ``SRCoulomb``'s energy, which aimnet sums over each atom's full
    neighbor row: the same sum, kept per receiving atom (half of each pair's energy).
    ``table_q``: every atom's charge, the senders'; ``fixed``: shapes fixed (a capture)."""
    aimnet = _aimnet()
    d_ij, charges = data["d_ij"], data["charges"]
    q_j = table_q.index_select(0, data["nbmat"].flatten()).view_as(d_ij)
    if head.envelope == "exp":
        cutoff = aimnet.ops.exp_cutoff(d_ij, head.rc)
    else:
        # a tensor on the GPU is not read back with fixed shapes (a capture); eagerly the
        # float, as before (in float32 the two may round pi / rc apart)
        cutoff = aimnet.ops.cosine_cutoff(d_ij, head.rc if fixed else float(head.rc))
    e_ij = (cutoff * charges[:, None] * q_j / d_ij).masked_fill(data["mask_ij"], 0.0)
    return head._factor * e_ij.sum(-1, dtype=torch.float64)
