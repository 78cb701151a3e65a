"""UMA (fairchem-core's eSCN-MD backbone and energy head) on a LocalGraph.

The potential runs the modules of a ``fairchem.core.models.uma.escn_md.eSCNMDBackbone`` and
its ``MLP_EFS_Head`` itself, in the order of the backbone's own ``forward``: the charge /
spin / task embedding, the element embedding, the Wigner rotations of every edge, the edge
degree embedding, the message-passing blocks (with the charge and spin channel balancing
where the model has it), the final norm, and the head's energy MLP. fairchem builds its own
radius graph; here the graph is LAMMPS's: fairchem's edge ``k`` runs from
``edge_index[0, k]`` (source) to ``edge_index[1, k]`` (target, where messages are summed)
with ``edge_distance_vec = x[source] - x[target]``, which is ``pair_j -> pair_i`` with
``rij``. No neighbor search is done here and the cell is never read.

What differs from fairchem, and why:

- after the edge degree embedding and after every block but the last, the node embeddings
  go through ``graph.comm.forward_exchange``, so that ghost rows hold their owners' values
  for the next block's messages (the identity under the widened ghost shell, where ghosts
  compute their own). The edge degree embedding is a message-passing step of its own (an
  atom's embedding after it depends on its neighbors' positions and elements), so
  ``layers`` is the number of blocks plus one;
- the charge / spin channel balancing (``charge_balanced_channels``,
  ``spin_balanced_channels``) sums over owned atoms and adds up over ranks with
  ``graph.comm.allreduce``;
- per-atom energies are returned instead of the head's per-system sum;
- fairchem turns each edge's frame about the edge by a random angle at every call, to which
  the model is invariant up to rounding (1e-16 relative in float64); here edge ``k`` turns
  by the ``k``-th draw of torch's CPU generator seeded with :data:`ROLL_SEED` (its draws
  do not depend on how many are drawn), on every device, so that an evaluation repeats
  bit for bit, eagerly or captured;
- fairchem caps an atom's neighbors at ``max_neighbors`` (the nearest); LAMMPS lists all
  pairs within the cutoff. A rank on which an atom has more neighbors than that within the
  cutoff stops with an error instead of computing another function.

Captured as CUDA graphs (:meth:`Uma.prepare_capture`) on a graph padded to capacities
(``engine/_padding.py``), padding is inert: padding atoms (species -1) send nothing but
along padding pairs, which join padding atoms only and lie beyond the cutoff, where
fairchem's envelope is exactly zero (value and gradient), so their messages are zero; the
channel balancing, the composition and the energies leave padding atoms out. Nothing in
the forward or backward waits for the host: what reads values or copies host data runs
outside the capture, at the engine's warm-ups, and is remembered for it: the system's
charge, spin and embedding (constants of a capture: the engine captures again when they
change) and the roll angles, drawn for the capacity's edge count. The neighbor count runs
outside too, before each replay (:meth:`Uma.check_graph`).

The system's net charge is ``graph.total_charge`` (``pair_style nvalchemi ... charge Q``),
an integer from -100 to 100 as UMA embeds it. The spin multiplicity (0 for "not given", the
value UMA's non-molecular tasks use; 1 for a singlet) and the task (one of the model's
datasets, e.g. ``omat`` or ``omol``) are set when the model file is written, and
``pair_style ... spin S task NAME`` may replace them.

UMA's released architecture runs too (:meth:`Uma.from_checkpoint` reads a fairchem
checkpoint such as ``uma-s-1p1.pt``): the mixture-of-linear-experts backbone
(``eSCNMDMoeBackbone``), whose expert coefficients come from the composition of the whole
system (per-element counts of owned atoms, summed over ranks with
``graph.comm.allreduce`` at every evaluation: the same on every rank, and right after atoms
migrate or are deleted) and its charge, spin and task; a head with an expert per dataset
(``DatasetSpecificMoEWrapper``); and the predict unit's normalization, per atom
``rmsd * e_i + mean / N + e_ref(Z_i)``. The coefficients are set on fairchem's modules
for each evaluation (as fairchem does): one evaluation at a time per potential object.

fairchem-core is an optional dependency (``pip install 'nvalchemi-lammps[uma]'``, in an
environment of its own: it needs another e3nn than mace-torch), imported only when a UMA
model is built. UMA runs in float32, the default here; ``dtype = "float64"`` builds the
model in float64 (as fairchem's predict unit does for ``base_precision_dtype``), for
checks of exactness.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import torch

from .._quiet import without_warnings, without_warp_banner
from ..contract import LocalGraph, ModelSpec, check_keys
from . import _capture
from ._base import Potential, register_potential
from ._charge import checked_total_charge

_DTYPES = {"float32": torch.float32, "float64": torch.float64}

#: Spin multiplicity range of UMA's embedding (fairchem ``ChgSpinEmbedding``; the charge's
#: is ``_charge.MAX_CHARGE``).
MAX_SPIN = 100

#: Seed of the random roll angles of the edge frames (see ``Uma.forward``).
ROLL_SEED = 0

#: The table of roll angles grows by at least this factor when an evaluation has more edges.
ROLL_GROWTH = 1.25

#: Backbone options that describe fairchem's own graph construction, force and stress
#: outputs or training: set here, whatever a configuration says.
_FIXED_OPTIONS = {
    "otf_graph": False,
    "regress_forces": False,
    "direct_forces": False,
    "regress_stress": False,
    "direct_stress": False,
    "regress_hessian": False,
    "activation_checkpointing": False,
}

_INSTALL_HINT = (
    "the uma potential needs fairchem-core: pip install 'nvalchemi-lammps[uma]' "
    "(or pip install fairchem-core; it needs an environment without mace-torch)"
)

#: fairchem scripts a few functions with ``torch.jit.script``, which recent torch deprecates.
_JIT_SCRIPT_DEPRECATED = (r"`torch\.jit\.script` is deprecated", DeprecationWarning)

_ESCN_MD: Any = None


def _escn_md() -> Any:
    """fairchem's ``escn_md`` module, imported once.

    Importing fairchem initializes Warp, which prints a banner to stdout: that banner is
    dropped, anything else printed is kept. fairchem scripts a few functions with
    ``torch.jit.script``, which recent torch deprecates: that warning says nothing about the
    model.
    """
    global _ESCN_MD
    if _ESCN_MD is not None:
        return _ESCN_MD
    try:
        with without_warp_banner(), without_warnings(_JIT_SCRIPT_DEPRECATED):
            from fairchem.core.models.uma import escn_md
    except ImportError as err:
        raise ImportError(f"{_INSTALL_HINT} ({err})") from err
    _ESCN_MD = escn_md
    return _ESCN_MD


def _escn_moe() -> Any:
    """fairchem's ``escn_moe`` module (mixture-of-experts backbone and heads)."""
    _escn_md()
    with without_warp_banner(), without_warnings(_JIT_SCRIPT_DEPRECATED):
        from fairchem.core.models.uma import escn_moe
    return escn_moe


def _atomic_number(symbol: str) -> int:
    from ase.data import atomic_numbers

    if symbol not in atomic_numbers or symbol == "X":
        return -1
    return int(atomic_numbers[symbol])


#: fairchem's names of the backbones this potential runs (``model`` in a backbone
#: configuration, as fairchem's checkpoints write it); no ``model``: the plain one.
_BACKBONES = {
    "escnmd_backbone": "eSCNMDBackbone",
    "fairchem.core.models.uma.escn_md.eSCNMDBackbone": "eSCNMDBackbone",
    "escnmd_moe_backbone": "eSCNMDMoeBackbone",
    "fairchem.core.models.uma.escn_moe.eSCNMDMoeBackbone": "eSCNMDMoeBackbone",
}


def build_backbone(
    backbone: dict[str, Any],
    head_experts: dict[str, str] | None = None,
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.nn.Module, torch.nn.Module]:
    """fairchem's backbone (``eSCNMDBackbone``, or ``eSCNMDMoeBackbone`` where
    ``backbone["model"]`` names it) and its energy head from the backbone's keyword
    arguments, with random weights (drawn from torch's generator, forked: the caller seeds
    it) and :data:`_FIXED_OPTIONS`. The head is ``MLP_EFS_Head``, or with ``head_experts``
    (a dataset mapping) fairchem's ``DatasetSpecificMoEWrapper`` around one: an expert per
    dataset. Built in ``dtype`` as fairchem's predict unit builds it: the constants computed
    at construction (the S2 grid, the coefficient mapping) then have that precision, not
    float32's cast; the random weights are drawn in float32 whatever ``dtype``.

    :raises ValueError: an unknown backbone, an option the backbone does not have, or one
        it refuses
    """
    escn_md = _escn_md()
    options = {**copy.deepcopy(backbone), **_FIXED_OPTIONS}
    model = options.pop("model", "escnmd_backbone")
    if model not in _BACKBONES:
        raise ValueError(
            f"UMA backbone {model} is not supported (supported: {', '.join(sorted(_BACKBONES))})"
        )
    mode = options.get("execution_mode", "general")
    if mode != "general":
        raise ValueError(f"UMA execution_mode {mode} is not supported (supported: general)")
    moe = _BACKBONES[model] == "eSCNMDMoeBackbone" or head_experts is not None
    escn_moe = _escn_moe() if moe else None
    if _BACKBONES[model] == "eSCNMDMoeBackbone":
        cls = escn_moe.eSCNMDMoeBackbone
    else:
        cls = escn_md.eSCNMDBackbone

    def build(precision: torch.dtype) -> tuple[torch.nn.Module, torch.nn.Module]:
        default_dtype = torch.get_default_dtype()
        try:
            torch.set_default_dtype(precision)
            with torch.random.fork_rng(devices=[]), torch.device("cpu"):
                network = cls(**options)
                if head_experts is None:
                    return network, escn_md.MLP_EFS_Head(network)
                return network, escn_moe.DatasetSpecificMoEWrapper(
                    network,
                    "fairchem.core.models.uma.escn_md.MLP_EFS_Head",
                    head_kwargs={"wrap_property": False},
                    dataset_mapping=dict(head_experts),
                )
        except (TypeError, ValueError) as err:
            raise ValueError(f"UMA backbone configuration: {err}") from None
        finally:
            torch.set_default_dtype(default_dtype)

    # weights drawn in float32 (as UMA is trained), then taken by a model built in dtype
    network, head = build(torch.float32)
    if dtype != torch.float32:
        weights = (network.state_dict(), head.state_dict())
        network, head = build(dtype)
        network.load_state_dict(weights[0])
        head.load_state_dict(weights[1])
    return network, head


def _checked_normalization(
    normalization: dict[str, dict[str, Any]] | None, numbers: list[int], elements: list[str]
) -> dict[str, dict[str, Any]] | None:
    """``normalization`` (see :class:`Uma`) with floats, checked.

    :raises ValueError: a task without ``rmsd``, ``mean`` or ``element_references``, or
        references that do not reach every element's atomic number
    """
    if normalization is None:
        return None
    checked = {}
    for task, entry in normalization.items():
        missing = {"rmsd", "mean", "element_references"} - set(entry)
        if missing:
            raise ValueError(f"UMA normalization of task {task} lacks {', '.join(sorted(missing))}")
        references = entry["element_references"]
        if references is not None:
            references = [float(e) for e in references]
            short = [e for e, z in zip(elements, numbers) if z >= len(references)]
            if short:
                raise ValueError(f"UMA task {task} has no element reference for {', '.join(short)}")
        checked[task] = {
            "rmsd": float(entry["rmsd"]),
            "mean": float(entry["mean"]),
            "element_references": references,
        }
    return checked


def _check_spin(spin: int) -> None:
    if int(spin) != spin or not 0 <= spin <= MAX_SPIN:
        raise ValueError(f"spin multiplicity must be an integer from 0 to {MAX_SPIN}, got {spin}")


# --- the potential -------------------------------------------------------------------------


@register_potential
class Uma(Potential):
    """A fairchem eSCN-MD (UMA) backbone with its energy head, for one task.

    Per-atom energy = the head's energy MLP on the atom's final scalar embedding. Energies in
    eV, lengths in Angstrom (``units metal``); the cutoff is the backbone's; ``layers`` is
    the number of blocks plus one (the edge degree embedding).

    Build one with random weights with :meth:`random_weights`; the constructor takes
    :meth:`config`'s plain data.

    :param backbone: ``eSCNMDBackbone`` keyword arguments (``sphere_channels``, ``lmax``,
        ``num_layers``, ``cutoff``, ``dataset_mapping``, ...); options of fairchem's own
        graph construction and force outputs are overridden (:data:`_FIXED_OPTIONS`)
    :param elements: element symbols the model is used for, in model order
    :param task: the dataset (task) whose embedding is used, one of the backbone's
        ``dataset_mapping`` keys (ignored by a backbone without dataset embedding)
    :param spin: spin multiplicity, 0 to 100 (0: not given)
    :param dtype: ``float32`` (default, as UMA runs) or ``float64``
    :param head_experts: the dataset mapping of a head with one expert per dataset
        (fairchem's ``DatasetSpecificMoEWrapper``); ``None``: one head for every task
    :param normalization: per task, what fairchem's predict unit does to the head's
        energy: ``{"rmsd": s, "mean": m, "element_references": [e_Z for Z = 0, 1, ...] or
        None}``, energy = ``s * head + m + sum of e_Z``; ``None``: the head's energy as it
        is. Where given, only its tasks run.
    :param model_id: fairchem's model generation (``UMA-1.1``, ``UMA-S-1.2``, ...), which
        decides how the expert mixing averages the composition
    """

    name = "uma"

    def __init__(
        self,
        backbone: dict[str, Any],
        elements: list[str],
        task: str,
        spin: int = 0,
        dtype: str = "float32",
        head_experts: dict[str, str] | None = None,
        normalization: dict[str, dict[str, Any]] | None = None,
        model_id: str | None = None,
    ) -> None:
        super().__init__()
        if dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(_DTYPES)}; got '{dtype}'")
        _check_spin(spin)
        elements = list(elements)
        network, head = build_backbone(backbone, head_experts, _DTYPES[dtype])
        numbers = [_atomic_number(e) for e in elements]
        unknown = [e for e, z in zip(elements, numbers) if not 0 < z < network.max_num_elements]
        if unknown:
            raise ValueError(
                f"element(s) {', '.join(unknown)} not in this UMA model, which embeds "
                f"atomic numbers 1..{network.max_num_elements - 1}"
            )
        self.backbone = network.to(_DTYPES[dtype]).eval()
        self.experts = getattr(network, "num_experts", 0) > 0
        self.model_id = model_id
        if head_experts is None:
            self.energy_block = head.energy_block.to(_DTYPES[dtype]).eval()
            self._head = None
        else:  # the expert layers read their coefficients from the wrapper's globals
            self.energy_block = head.head.energy_block.to(_DTYPES[dtype]).eval()
            self._head = (head.global_mole_tensors, dict(head.dataset_name_to_exp))
        self.normalization = _checked_normalization(normalization, numbers, elements)
        # element references of each task as rows (float64, as fairchem's are), by task
        tasks = sorted(self.normalization or {})
        self._reference_row = {t: k for k, t in enumerate(tasks)}
        rows = [(self.normalization[t]["element_references"] or []) for t in tasks]
        width = max((len(r) for r in rows), default=0)
        table = torch.zeros(len(rows), width, dtype=torch.float64)
        for k, row in enumerate(rows):
            table[k, : len(row)] = torch.tensor(row, dtype=torch.float64)
        self.register_buffer("element_references", table, persistent=False)
        self._check_task(task)
        for parameter in self.parameters():
            parameter.requires_grad_(False)
        self.register_buffer(
            "atomic_numbers", torch.tensor(numbers, dtype=torch.int64), persistent=False
        )
        self.task = task
        self.spin = int(spin)
        # the roll angles' table, by dtype and device; the values made outside a capture
        self._rolls: dict[tuple[torch.dtype, torch.device], torch.Tensor] = {}
        self._remembered: dict[str, tuple[Any, Any]] = {}
        self._for_capture = False
        self.spec = ModelSpec(
            elements=tuple(elements),
            cutoff=float(network.cutoff),
            units="metal",
            dtype=dtype,
            layers=network.num_layers + 1,
        )
        self._config = {
            "backbone": copy.deepcopy(backbone),
            "elements": elements,
            "task": task,
            "spin": self.spin,
            "dtype": dtype,
            "head_experts": None if head_experts is None else dict(head_experts),
            "normalization": copy.deepcopy(normalization),
            "model_id": model_id,
        }

    def config(self) -> dict[str, Any]:
        return copy.deepcopy(self._config)

    system_state = ("spin", "task")

    def check_system_state(self, spin: int | None, task: str | None) -> None:
        """Refuse a spin or task given in the input script (``pair_style ... spin S task
        NAME``) that this model cannot take; ``None``: the model's own."""
        if spin is not None:
            _check_spin(spin)
        if task is not None:
            self._check_task(task)

    def _check_task(self, task: str) -> None:
        network = self.backbone
        known = set(network.dataset_mapping) if network.use_dataset_embedding else None
        if self._head is not None:
            known = set(self._head[1]) if known is None else known & set(self._head[1])
        if self.normalization is not None:
            known = set(self.normalization) if known is None else known & set(self.normalization)
        if known is not None and task not in known:
            raise ValueError(
                f"unknown UMA task '{task}' (this model's tasks: {', '.join(sorted(known))})"
            )

    @classmethod
    def random_weights(cls, *arguments: Any, seed: int = 0, **keywords: Any) -> Uma:
        """UMA with random weights drawn with ``seed`` (for tests and benchmarks), from
        fairchem's own initialization of the backbone configuration: the constructor's
        arguments (``backbone``, ``elements``, ``task``, ``spin``, ``dtype``, ...)."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return cls(*arguments, **keywords)

    @classmethod
    def from_checkpoint(
        cls,
        path: str | Path,
        task: str,
        elements: list[str] | None = None,
        spin: int = 0,
        dtype: str = "float32",
    ) -> Uma:
        """A fairchem checkpoint file (``uma-s-1p1.pt``, ...) as fairchem's predict unit
        runs it: the backbone (mixture of experts included), the energy head (with an expert
        per dataset included), and per task the energy's normalizer and element references.
        The file is unpickled (as fairchem does): only read files you trust.

        :param task: the default task (``pair_style ... task NAME`` chooses another)
        :param elements: element symbols in model order; ``None``: every element the model
            embeds, H to the last
        :raises ValueError: the file is missing, unreadable, or a model not supported
            (see :mod:`._uma_checkpoint`)
        """
        from ._uma_checkpoint import read_checkpoint

        if Path(path).is_file():
            _escn_md()  # fairchem imported once and quietly, before the checkpoint's imports
        arguments, state = read_checkpoint(path)
        if elements is None:
            from ase.data import chemical_symbols

            last = int(arguments["backbone"].get("max_num_elements", 100))
            elements = list(chemical_symbols[1:last])
        potential = cls(elements=list(elements), task=task, spin=spin, dtype=dtype, **arguments)
        potential.load_state_dict(state)
        return potential

    @classmethod
    def from_export_config(cls, config: dict[str, Any]) -> Uma:
        """What ``nvalchemi-lammps export`` builds from a TOML file with
        ``potential = "uma"``: either ``checkpoint`` (a fairchem checkpoint file, see
        :meth:`from_checkpoint`), ``task`` and optionally ``elements``; or ``seed`` (random
        weights), ``elements``, ``task`` and a ``[backbone]`` table (``eSCNMDBackbone``
        arguments). Both take ``spin`` (multiplicity, default 0) and ``dtype`` (default
        float32).
        """
        if "checkpoint" in config:
            return cls._from_checkpoint_config(config)
        allowed = ("seed", "backbone", "elements", "task", "spin", "dtype")
        check_keys(config, "potential uma", allowed, ("seed", "backbone", "elements", "task"))
        try:
            return cls.random_weights(
                dict(config["backbone"]),
                list(config["elements"]),
                str(config["task"]),
                seed=int(config["seed"]),
                spin=config.get("spin", 0),
                dtype=config.get("dtype", "float32"),
            )
        except ImportError as err:  # the CLI reports ValueErrors as one line
            raise ValueError(str(err)) from None

    @classmethod
    def _from_checkpoint_config(cls, config: dict[str, Any]) -> Uma:
        allowed = ("checkpoint", "elements", "task", "spin", "dtype")
        check_keys(config, "potential uma from a checkpoint", allowed)
        if "task" not in config:
            raise ValueError("potential uma needs key(s) task")
        elements = config.get("elements")
        try:
            return cls.from_checkpoint(
                config["checkpoint"],
                str(config["task"]),
                elements=None if elements is None else list(elements),
                spin=config.get("spin", 0),
                dtype=config.get("dtype", "float32"),
            )
        except ImportError as err:  # the CLI reports ValueErrors as one line
            raise ValueError(str(err)) from None

    # --- evaluation ------------------------------------------------------------------------

    def prepare_capture(self) -> Uma:
        """A copy sharing the modules (itself if prepared already), with the values it makes
        outside the captures (module doc) its own: a graph reads them where they were at its
        capture, and an eager evaluation of this potential then does not replace them."""
        if self._for_capture:
            return self
        prepared = copy.copy(self)
        prepared._rolls, prepared._remembered = {}, {}
        prepared._for_capture = True
        return prepared

    def forward(self, graph: LocalGraph) -> torch.Tensor:
        """Per-atom energies ``(ntotal,)``: right for owned rows (the engine sums those)."""
        backbone, dtype = self.backbone, self.spec.torch_dtype
        n, device = graph.ntotal, graph.species.device
        mapped = graph.species >= 0
        numbers = torch.where(mapped, self.atomic_numbers[graph.species.clamp(min=0)], 0)
        capturing = _capture.capturing()
        if not capturing:
            self.check_graph(graph)

        # the input script's spin and task, else the model's own
        spin = self.spin if graph.spin is None else graph.spin
        task = self.task if graph.task is None else graph.task
        state = (round(checked_total_charge(graph.total_charge)), spin, task, dtype, device)
        charge, spin, system = self._outside_capture("system", state, capturing, self._system)
        sys_node_embedding = system.expand(n, -1)
        counts = self._composition(numbers, mapped, graph)

        # the graph: edges pair_j (source) -> pair_i (target), vector x[j] - x[i]. fairchem's
        # convolutions need an edge: without pairs, a dummy row n gets a self-loop longer than
        # the cutoff (as fairchem's add_n_empty_edges), whose envelope makes its message zero
        # (a padded graph always has a padding pair)
        senders, receivers, vectors = graph.pair_j, graph.pair_i, graph.rij.to(dtype)
        rows = n
        if graph.npairs == 0:
            rows = n + 1
            senders = receivers = torch.full((1,), n, dtype=torch.int64, device=device)
            # joined to rij (empty) so that the backward reaches this rank's exchanges
            dummy = torch.full((1, 3), 1.0 + backbone.cutoff, dtype=dtype, device=device)
            vectors = torch.cat([vectors, dummy])
            numbers = torch.cat([numbers, numbers.new_zeros(1)])
            sys_node_embedding = system.expand(rows, -1)
        edge_index = torch.stack([senders, receivers])
        distances = torch.linalg.norm(vectors, dim=-1)
        if self.experts:
            self._mix_experts(counts, system, edge_index.shape[1])
        rolls = self._roll_fractions(vectors.shape[0], dtype, device, capturing)
        wigner, wigner_inv = _rotations(backbone, vectors, rolls)
        coefficient_index = backbone.coefficient_index if backbone.mmax != backbone.lmax else None
        wigner, wigner_inv = backbone.backend.prepare_wigner(
            wigner, wigner_inv, backbone.mappingReduced, coefficient_index
        )

        x = torch.zeros(
            rows, backbone.sph_feature_size, backbone.sphere_channels, dtype=dtype, device=device
        )
        x[:, 0, :] = backbone.sphere_embedding(numbers) + sys_node_embedding

        envelope = backbone.envelope(distances / backbone.cutoff).reshape(-1, 1)
        x_edge = torch.cat(
            (
                backbone.distance_expansion(distances),
                backbone.source_embedding(numbers[senders]),
                backbone.target_embedding(numbers[receivers]),
            ),
            dim=1,
        )
        if wigner_inv.ndim == 3:
            envelope = envelope.unsqueeze(-1)
        wigner_inv_envelope = wigner_inv * envelope
        x = backbone.edge_degree_embedding(x, x_edge, receivers, wigner_inv_envelope)
        x = _exchange(x, graph)

        x_edge_per_layer = backbone.backend.get_layer_radial_emb(x_edge, backbone)
        last = backbone.num_layers - 1
        for k, block in enumerate(backbone.blocks):
            x = block(
                x,
                x_edge_per_layer[k],
                edge_index,
                wigner,
                wigner_inv_envelope,
                total_atoms_across_gp_ranks=rows,
                sys_node_embedding=sys_node_embedding,
                scatter_target=receivers,
            )
            x = self._balance_channels(x, mapped, charge, spin, graph)
            if k < last:
                x = _exchange(x, graph)

        x = backbone.norm(x)
        energies = self._head_energies(x[:n, 0, :], task)
        if self.normalization is not None:
            energies = self._denormalized(energies, numbers[:n], counts, task)
        return torch.where(mapped, energies, 0.0)

    # --- what is made outside a capture ----------------------------------------------------

    def _outside_capture(self, name: str, key: Any, capturing: bool, make: Any) -> Any:
        """``make(key)``, made where no capture is under way and remembered; inside a capture,
        the value remembered for the same ``key`` at the engine's warm-ups, which the graph
        then reads."""
        if capturing:
            remembered = self._remembered.get(name)
            if remembered is None or remembered[0] != key:
                raise RuntimeError(f"UMA's {name} was not made before the capture (no warm-up)")
            return remembered[1]
        value = make(key)
        self._remembered[name] = (key, value)
        return value

    def _system(
        self, state: tuple[int, int, str, torch.dtype, torch.device]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """fairchem's one system: charge and spin as the long integers it reads (copied from
        the host; its embedding reads values back), and their embedding with the task's. The
        embedding may write into ``spin`` (a linear embedding's spin 0), which the channel
        balancing then reads, as fairchem's does."""
        charge, spin, task, _, device = state
        charge = torch.tensor([charge], device=device)
        spin = torch.tensor([spin], device=device)
        return charge, spin, self.backbone.csd_embedding(charge, spin, [task])

    def _roll_fractions(
        self, count: int, dtype: torch.dtype, device: torch.device, capturing: bool
    ) -> torch.Tensor:
        """The roll angles of ``count`` edges in turns: the first ``count`` draws in ``dtype``
        (as fairchem's ``torch.rand``) of torch's CPU generator seeded with
        :data:`ROLL_SEED`, whatever the device. Kept in a table on the device, drawn again
        :data:`ROLL_GROWTH` times longer when outgrown: the CPU generator draws one value
        after the other, so the first ones stay the same. Inside a capture the table holds
        them already (drawn at the warm-ups, for the same edges): nothing is drawn or
        copied there."""
        table = self._rolls.get((dtype, device))
        if table is None or table.shape[0] < count:
            if capturing:
                raise RuntimeError(
                    f"UMA's roll angles of {count} edges were not drawn before the capture"
                )
            size = count if table is None else max(count, math.ceil(ROLL_GROWTH * len(table)))
            generator = torch.Generator().manual_seed(ROLL_SEED)
            table = torch.rand(size, dtype=dtype, generator=generator).to(device)
            self._rolls[(dtype, device)] = table
        return table[:count]

    # --- the mixture of experts and the predict unit's normalization ------------------------

    def _composition(
        self, numbers: torch.Tensor, mapped: torch.Tensor, graph: LocalGraph
    ) -> torch.Tensor | None:
        """Atoms of each atomic number in the whole system, ``(max_num_elements,)`` float64:
        owned atoms counted here, summed over ranks (the same on every rank: sums of
        integers). Only where the expert mixing or the energy's mean per system needs it
        (so, per model, on every rank or none)."""
        composition = self.experts and self.backbone.use_composition_embedding
        means = self.normalization is not None and any(
            t["mean"] != 0.0 for t in self.normalization.values()
        )
        if not (composition or means):
            return None
        # added up in float64 rather than bincount's, whose length is read back on a GPU
        owned = graph.nlocal
        counts = torch.zeros(
            self.backbone.max_num_elements, dtype=torch.float64, device=numbers.device
        )
        counts = counts.index_add_(0, numbers[:owned], mapped[:owned].to(torch.float64))
        return graph.comm.allreduce(counts)

    def _mix_experts(self, counts: torch.Tensor | None, system: torch.Tensor, edges: int) -> None:
        """fairchem's ``eSCNMDMoeBackbone.set_MOLE_coefficients`` and ``set_MOLE_sizes`` for
        one system: the expert coefficients from the mean composition embedding of the whole
        system (from ``counts``) and the charge / spin / task embedding ``system``; every
        edge of this rank in one segment."""
        backbone = self.backbone
        embeddings = []
        if backbone.use_composition_embedding:
            weight = backbone.composition_embedding.weight
            atoms = counts.sum()
            # UMA-S-1.2 averages with a zero for the system itself (fairchem keeps its bug)
            divisor = atoms + 1 if self.model_id == "UMA-S-1.2" else atoms.clamp(min=1)
            composition = (counts.to(weight.dtype) @ weight) / divisor.to(weight.dtype)
            embeddings.append(composition[None, None])
        embeddings.append(system[None])
        mixed = torch.vstack(embeddings).transpose(0, 1).reshape(system.shape[0], -1)
        coefficients = backbone.mole_expert_coefficient_norm(
            backbone.mole_dropout(backbone.routing_mlp(mixed))
        )
        backbone.global_mole_tensors.expert_mixing_coefficients = coefficients
        # on the host, where fairchem reads it (tolist)
        backbone.global_mole_tensors.mole_sizes = torch.full((1,), edges, dtype=torch.int64)

    def _head_energies(self, scalars: torch.Tensor, task: str) -> torch.Tensor:
        """The energy MLP on each atom's scalar embedding; a head with an expert per dataset
        takes the task's expert (fairchem's one-hot coefficients)."""
        if self._head is not None:
            tensors, expert_of = self._head
            experts = torch.arange(self.energy_block[0].weights.shape[0], device=scalars.device)
            tensors.expert_mixing_coefficients = (experts == expert_of[task]).to(scalars.dtype)[
                None
            ]
            tensors.mole_sizes = torch.full((1,), scalars.shape[0], dtype=torch.int64)
        return self.energy_block(scalars).squeeze(-1)

    def _denormalized(
        self, energies: torch.Tensor, numbers: torch.Tensor, counts: torch.Tensor | None, task: str
    ) -> torch.Tensor:
        """fairchem's predict unit per atom: the system's ``rmsd * sum + mean + sum of
        element references`` as ``rmsd * e_i + mean / N + e_Z(i)``."""
        norm = self.normalization[task]
        energies = energies * norm["rmsd"]
        if norm["mean"] != 0.0:
            energies = energies + norm["mean"] / counts.sum().clamp(min=1).to(energies.dtype)
        if norm["element_references"] is not None:
            references = self.element_references[self._reference_row[task]]
            energies = energies + references[numbers].to(energies.dtype)
        return energies

    def check_graph(self, graph: LocalGraph) -> None:
        """fairchem's graph keeps at most ``max_neighbors`` per atom: refuse more within the
        cutoff (module doc), where the envelope is not zero (padding pairs lie beyond it).
        The count is read back from the device: the forward checks where no capture is under
        way, the engine before each replay of a captured step."""
        if graph.npairs == 0:
            return
        distances = torch.linalg.norm(graph.rij.detach().to(self.spec.torch_dtype), dim=-1)
        inside = (distances / self.backbone.cutoff < 1.0).to(torch.int64)
        counts = inside.new_zeros(graph.ntotal).index_add_(0, graph.pair_i, inside)
        most = int(counts.max())
        if most > self.backbone.max_neighbors:
            raise ValueError(
                f"an atom has {most} neighbors within the UMA cutoff of {self.spec.cutoff:g} "
                f"Angstrom, more than the model's max_neighbors = {self.backbone.max_neighbors}"
            )

    def _balance_channels(
        self,
        x: torch.Tensor,
        mapped: torch.Tensor,
        charge: torch.Tensor,
        spin: torch.Tensor,
        graph: LocalGraph,
    ) -> torch.Tensor:
        """fairchem's ``balance_channels``: the charge (spin) channels' scalar parts are
        shifted so that they add up to the net charge (spin multiplicity - 1) over the
        system; the sums run over owned atoms and over ranks."""
        backbone = self.backbone
        ranges = [
            (backbone.charge_channel_start, backbone.charge_channel_end, charge, 0.0),
            (backbone.spin_channel_start, backbone.spin_channel_end, spin, 1.0),
        ]
        ranges = [r for r in ranges if r[1] > r[0]]
        if not ranges:
            return x
        owned = mapped[: graph.nlocal]
        for start, end, target, offset in ranges:
            sums = (x[: graph.nlocal, 0, start:end] * owned[:, None]).sum(0)
            count = owned.sum().to(x.dtype).reshape(1)
            totals = graph.comm.allreduce(torch.cat([sums, count]))
            correction = (totals[:-1] - (target.to(x.dtype) - offset)) / totals[-1]
            x = x.clone()
            x[:, 0, start:end] = x[:, 0, start:end] - correction
        return x


def _rotations(
    backbone: torch.nn.Module, vectors: torch.Tensor, fractions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """fairchem's ``_get_rotmat_and_wigner`` with the roll angles given (``fractions`` of a
    turn, its ``torch.rand`` draws): each edge's Wigner matrices and their inverses, by
    quaternions or by Euler angles as the backbone is set."""
    gamma = fractions * 2 * math.pi  # as fairchem scales its draws
    if backbone.use_quaternion_wigner:
        return _escn_md().axis_angle_wigner_hybrid(
            vectors,
            backbone.lmax,
            gamma=gamma,
            coeffs=backbone.wigner_data.coeffs,
            U_blocks=backbone.wigner_data.U_blocks,
            custom_kernels=backbone.wigner_data.custom_kernels,
            compact_l2=getattr(backbone.backend, "supports_fused_edgewise", False),
        )
    from fairchem.core.models.uma.common import rotation

    # init_edge_rot_euler_angles with gamma given
    xyz = torch.nn.functional.normalize(vectors).clamp(-1.0, 1.0)
    x, y, z = torch.split(xyz, 1, dim=1)
    beta = rotation.Safeacos.apply(y.squeeze(-1))
    alpha = rotation.Safeatan2.apply(x.squeeze(-1), z.squeeze(-1))
    jd = [getattr(backbone, f"Jd_{l}").type(vectors.dtype) for l in range(backbone.lmax + 1)]
    wigner = rotation.eulers_to_wigner((-gamma, -beta, -alpha), 0, backbone.lmax, jd)
    return wigner, torch.transpose(wigner, 1, 2).contiguous()


def _exchange(x: torch.Tensor, graph: LocalGraph) -> torch.Tensor:
    """Ghost rows of the node embeddings ``(rows, (lmax+1)^2, channels)`` take their
    owners' values (a dummy row after the ``ntotal`` atoms stays as it is)."""
    n = graph.ntotal
    exchanged = graph.comm.forward_exchange(x[:n].flatten(1)).view_as(x[:n])
    return torch.cat([exchanged, x[n:]]) if x.shape[0] > n else exchanged
