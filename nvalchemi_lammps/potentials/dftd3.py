"""DFT-D3 dispersion with Becke-Johnson damping (Grimme et al. 2010, 2011), two-body.

The same formulas as LAMMPS's ``pair_style dispersion/d3 bj`` and Grimme's ``dftd3``
program, in torch, differentiable (the engine takes forces and virial by autograd):

- coordination numbers ``CN_i = sum_j 1 / (1 + exp(-k1 (R_cov,ij / r_ij - 1)))`` over pairs
  with ``r_ij <= cn_cutoff``;
- ``C6_ij(CN_i, CN_j)``: the reference ``C6`` values of the element pair weighted by
  ``exp(k3 ((CN_i - CN_i,ref)^2 + (CN_j - CN_j,ref)^2))``; ``C8 = 3 C6 Q_i Q_j``;
- ``E = -sum_{i<j} s6 C6 / (r^6 + R0^6) + s8 C8 / (r^8 + R0^8)`` over pairs with
  ``r_ij < cutoff``, ``R0 = a1 sqrt(C8 / C6) + a2``.

Both cutoffs are sharp, as in LAMMPS (no smoothing, no shift). The three-body
Axilrod-Teller-Muto term is not included (LAMMPS's style omits it too).

``C6`` of a pair depends on the coordination numbers of both atoms, and a ghost atom's CN
needs pairs this rank does not see: it is a message-passing potential of two layers. With
the ``exchange`` strategy the CNs of owned atoms are forward-exchanged to their ghosts
(LAMMPS's reverse communication carries ``dE/dCN`` back to the owners); with ``shell`` every
ghost computes its own CN from its own pairs.

The reference data (``C6`` tables, covalent radii, ``<r^4>/<r^2>``) are read at export from
the file the ``aimnet`` package ships (``aimnet/dftd3_data.pt``, or any file of that layout)
and stored in the model file for the model's elements only: nothing is downloaded, and
``aimnet`` is not needed to run.
"""

from __future__ import annotations

import importlib.util
import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..contract import LocalGraph, ModelSpec, check_keys
from ._base import Potential, register_potential

_SYMBOLS = (
    "H He Li Be B C N O F Ne Na Mg Al Si P S Cl Ar K Ca Sc Ti V Cr Mn Fe Co Ni Cu Zn Ga Ge "
    "As Se Br Kr Rb Sr Y Zr Nb Mo Tc Ru Rh Pd Ag Cd In Sn Sb Te I Xe Cs Ba La Ce Pr Nd Pm Sm "
    "Eu Gd Tb Dy Ho Er Tm Yb Lu Hf Ta W Re Os Ir Pt Au Hg Tl Pb Bi Po At Rn Fr Ra Ac Th Pa U "
    "Np Pu"
)
#: Element symbols by atomic number - 1: the elements D3 has parameters for (H to Pu).
ELEMENTS = tuple(_SYMBOLS.split())

#: CODATA 2018 Bohr radius (Angstrom) and Hartree energy (eV): the D3 atomic units.
BOHR = 0.529177210903
HARTREE = 27.211386245988
#: The constants of LAMMPS's ``pair_style dispersion/d3`` (``autoang``, ``autoev``): pass
#: ``bohr=LAMMPS_BOHR, hartree=LAMMPS_HARTREE`` to reproduce it.
LAMMPS_BOHR = 0.52917725
LAMMPS_HARTREE = 27.21140795

#: Steepness of the CN counting function and of the Gaussian CN weights (Grimme's k1, k3).
K1 = 16.0
K3 = -4.0
#: Reference coordination numbers per element in the D3 tables.
MAX_REFERENCES = 5

#: D3(BJ) parameters ``(s6, a1, s8, a2)`` by functional (``a2`` in Bohr), from Grimme's
#: tables as LAMMPS's ``pair_dispersion_d3.cpp`` lists them (same names).
BJ_FUNCTIONALS: dict[str, tuple[float, float, float, float]] = {
    "b-p": (1.0, 0.3946, 3.2822, 4.8516),
    "b-lyp": (1.0, 0.4298, 2.6996, 4.2359),
    "revpbe": (1.0, 0.5238, 2.3550, 3.5016),
    "rpbe": (1.0, 0.1820, 0.8318, 4.0094),
    "b97-d": (1.0, 0.5545, 2.2609, 3.2297),
    "pbe": (1.0, 0.4289, 0.7875, 4.4407),
    "rpw86-pbe": (1.0, 0.4613, 1.3845, 4.5062),
    "b3-lyp": (1.0, 0.3981, 1.9889, 4.4211),
    "tpss": (1.0, 0.4535, 1.9435, 4.4752),
    "hf": (1.0, 0.3385, 0.9171, 2.8830),
    "tpss0": (1.0, 0.3768, 1.2576, 4.5865),
    "pbe0": (1.0, 0.4145, 1.2177, 4.8593),
    "hse06": (1.0, 0.383, 2.310, 5.685),
    "revpbe38": (1.0, 0.4309, 1.4760, 3.9446),
    "pw6b95": (1.0, 0.2076, 0.7257, 6.3750),
    "b2-plyp": (0.64, 0.3065, 0.9147, 5.0570),
    "dsd-blyp": (0.50, 0.0000, 0.2130, 6.0519),
    "dsd-blyp-fc": (0.50, 0.0009, 0.2112, 5.9807),
    "bop": (1.0, 0.4870, 3.2950, 3.5043),
    "mpwlyp": (1.0, 0.4831, 2.0077, 4.5323),
    "o-lyp": (1.0, 0.5299, 2.6205, 2.8065),
    "pbesol": (1.0, 0.4466, 2.9491, 6.1742),
    "bpbe": (1.0, 0.4567, 4.0728, 4.3908),
    "opbe": (1.0, 0.5512, 3.3816, 2.9444),
    "ssb": (1.0, -0.0952, -0.1744, 5.2170),
    "revssb": (1.0, 0.4720, 0.4389, 4.0986),
    "otpss": (1.0, 0.4634, 2.7495, 4.3153),
    "b3pw91": (1.0, 0.4312, 2.8524, 4.4693),
    "bh-lyp": (1.0, 0.2793, 1.0354, 4.9615),
    "revpbe0": (1.0, 0.4679, 1.7588, 3.7619),
    "tpssh": (1.0, 0.4529, 2.2382, 4.6550),
    "mpw1b95": (1.0, 0.1955, 1.0508, 6.4177),
    "pwb6k": (1.0, 0.1805, 0.9383, 7.7627),
    "b1b95": (1.0, 0.2092, 1.4507, 5.5545),
    "bmk": (1.0, 0.1940, 2.0860, 5.9197),
    "cam-b3lyp": (1.0, 0.3708, 2.0674, 5.4743),
    "lc-wpbe": (1.0, 0.3919, 1.8541, 5.0897),
    "b2gp-plyp": (0.56, 0.0000, 0.2597, 6.3332),
    "ptpss": (0.75, 0.0000, 0.2804, 6.5745),
    "pwpb95": (0.82, 0.0000, 0.2904, 7.3141),
    "hf/mixed": (1.0, 0.5607, 3.9027, 4.5622),
    "hf/sv": (1.0, 0.4249, 2.1849, 4.2783),
    "hf/minis": (1.0, 0.1702, 0.9841, 3.8506),
    "b3-lyp/6-31gd": (1.0, 0.5014, 4.0672, 4.8409),
    "hcth120": (1.0, 0.3563, 1.0821, 4.3359),
    "pw1pw": (1.0, 0.3807, 2.3363, 5.8844),
    "pwgga": (1.0, 0.2211, 2.6910, 6.7278),
    "hsesol": (1.0, 0.4650, 2.9215, 6.2003),
    "hf3c": (1.0, 0.4171, 0.8777, 2.9149),
    "hf3cv": (1.0, 0.3063, 0.5022, 3.9856),
    "pbeh3c": (1.0, 0.4860, 0.0000, 4.5000),
    "pbeh-3c": (1.0, 0.4860, 0.0000, 4.5000),
    "mn15": (1.0, 2.0971, 0.7862, 7.5923),
    "r2scan": (1.0, 0.4948, 0.7898, 5.7308),
}
#: Common spellings of functionals that Grimme's tables write with hyphens.
ALIASES = {"b3lyp": "b3-lyp", "blyp": "b-lyp", "bp86": "b-p", "bp": "b-p", "b2plyp": "b2-plyp"}


def _functional_parameters(functional: str) -> tuple[float, float, float, float]:
    name = functional.lower()
    name = ALIASES.get(name, name)
    if name not in BJ_FUNCTIONALS:
        known = ", ".join(sorted(BJ_FUNCTIONALS) + sorted(ALIASES))
        raise ValueError(f"no D3(BJ) parameters for functional '{functional}' (known: {known})")
    return BJ_FUNCTIONALS[name]


@dataclass(frozen=True)
class D3Reference:
    """The D3 reference data of a model's elements (atomic units, float64).

    :param rcov: ``(n,)`` scaled covalent radii (Bohr)
    :param r4r2: ``(n,)`` ``Q = sqrt(0.5 <r^4>/<r^2> sqrt(Z))`` per element
    :param c6: ``(n, n, 5, 5)`` reference ``C6`` (Hartree Bohr^6); 0 where there is none
    :param cn_i: ``(n, n, 5, 5)`` coordination number of the first atom at each reference
    :param cn_j: ``(n, n, 5, 5)`` coordination number of the second atom, likewise
    """

    rcov: torch.Tensor
    r4r2: torch.Tensor
    c6: torch.Tensor
    cn_i: torch.Tensor
    cn_j: torch.Tensor

    @classmethod
    def placeholder(cls, n: int) -> D3Reference:
        """Zeros of the right shapes, for a potential whose tensors come from a model file."""
        table = torch.zeros(n, n, MAX_REFERENCES, MAX_REFERENCES, dtype=torch.float64)
        vec = torch.zeros(n, dtype=torch.float64)
        return cls(vec, vec.clone(), table, table.clone(), table.clone())

    @classmethod
    def from_file(cls, elements: list[str], path: str | Path | None = None) -> D3Reference:
        """The data of ``elements`` from a file in aimnet's layout (``c6ab``
        ``[95, 95, 5, 5, 3]`` holding ``C6, CN_i, CN_j``; ``rcov`` and ``r4r2`` ``[95]``;
        row = atomic number).

        :param path: the file; by default the one the installed ``aimnet`` package ships
        :raises ImportError: no ``path`` and aimnet is not installed
        :raises ValueError: an element without D3 parameters, or a file not of that layout
        """
        unknown = [e for e in elements if e not in ELEMENTS]
        if unknown:
            raise ValueError(
                f"no D3 parameters for element(s) {', '.join(unknown)}: D3 covers H to Pu "
                "(symbols as in the periodic table, e.g. 'C', 'Si')"
            )
        path = Path(path) if path is not None else _aimnet_data_file()
        if not path.is_file():
            raise ValueError(f"D3 parameter file {path} not found")
        data = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(data, dict) or any(k not in data for k in ("c6ab", "rcov", "r4r2")):
            raise ValueError(f"{path} is not a D3 parameter file (needs c6ab, rcov and r4r2)")
        shape = (95, 95, MAX_REFERENCES, MAX_REFERENCES, 3)
        if tuple(data["c6ab"].shape) != shape:
            raise ValueError(f"{path}: c6ab has shape {tuple(data['c6ab'].shape)}, not {shape}")
        z = torch.tensor([ELEMENTS.index(e) + 1 for e in elements])
        table = data["c6ab"].to(torch.float64)[z][:, z]
        return cls(
            rcov=data["rcov"].to(torch.float64)[z],
            r4r2=data["r4r2"].to(torch.float64)[z],
            c6=table[..., 0].contiguous(),
            cn_i=table[..., 1].contiguous(),
            cn_j=table[..., 2].contiguous(),
        )


def _aimnet_data_file() -> Path:
    # located without importing aimnet (which would load its models and Warp)
    spec = importlib.util.find_spec("aimnet")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            "DFT-D3 reference data come from the aimnet package, which is not installed: "
            "pip install 'nvalchemi-lammps[toolkit]' (or aimnet), or give parameter_file"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "dftd3_data.pt"


@register_potential
class DFTD3(Potential):
    """DFT-D3(BJ) two-body dispersion, metal units (eV, Angstrom).

    :param elements: element symbols (each must have D3 parameters: H to Pu)
    :param cutoff: dispersion cutoff (Angstrom): pairs with ``r < cutoff`` contribute
    :param cn_cutoff: coordination-number cutoff (Angstrom): pairs with
        ``r <= cn_cutoff`` count
    :param functional: name of a functional in :data:`BJ_FUNCTIONALS` (case-insensitive),
        or ``None`` to give all of ``a1``, ``s8``, ``a2`` (and optionally ``s6``)
    :param s6: overrides the functional's ``s6``
    :param s8: overrides the functional's ``s8``
    :param a1: overrides the functional's ``a1``
    :param a2: overrides the functional's ``a2`` (Bohr)
    :param bohr: the Bohr radius in Angstrom (D3 is defined in atomic units)
    :param hartree: the Hartree energy in eV
    :param dtype: ``float64`` or ``float32``
    :param reference: the D3 data of ``elements``; by default read from aimnet's file
    """

    name = "dftd3"

    def __init__(
        self,
        elements: list[str],
        cutoff: float,
        cn_cutoff: float,
        functional: str | None = "pbe",
        s6: float | None = None,
        s8: float | None = None,
        a1: float | None = None,
        a2: float | None = None,
        bohr: float = BOHR,
        hartree: float = HARTREE,
        dtype: str = "float64",
        reference: D3Reference | None = None,
    ) -> None:
        super().__init__()
        if functional is not None:
            preset = dict(zip(("s6", "a1", "s8", "a2"), _functional_parameters(functional)))
        else:
            missing = [k for k, v in (("a1", a1), ("s8", s8), ("a2", a2)) if v is None]
            if missing:
                raise ValueError(
                    f"without a functional, D3(BJ) needs {', '.join(missing)} (and optionally s6)"
                )
            preset = {"s6": 1.0}
        overrides = {"s6": s6, "s8": s8, "a1": a1, "a2": a2}
        damping = {**preset, **{k: float(v) for k, v in overrides.items() if v is not None}}
        for what, value in (("cutoff", cutoff), ("cn_cutoff", cn_cutoff)):
            if not float(value) > 0.0:
                raise ValueError(f"{what} must be positive, got {value}")
        self.spec = ModelSpec(
            elements=tuple(elements),
            cutoff=max(float(cutoff), float(cn_cutoff)),
            units="metal",
            dtype=dtype,
            layers=2,
            strategies=("exchange", "shell"),
        )
        self._config = {
            "elements": list(elements),
            "cutoff": float(cutoff),
            "cn_cutoff": float(cn_cutoff),
            "functional": functional,
            "s6": s6,
            "s8": s8,
            "a1": a1,
            "a2": a2,
            "bohr": float(bohr),
            "hartree": float(hartree),
            "dtype": dtype,
        }
        self.damping = damping
        self.bohr = float(bohr)
        self.hartree = float(hartree)
        self.cutoff_sq = float(cutoff) * float(cutoff)
        self.cn_cutoff_sq = float(cn_cutoff) * float(cn_cutoff)
        if reference is None:
            reference = D3Reference.from_file(list(elements))
        n = len(elements)
        if reference.c6.shape != (n, n, MAX_REFERENCES, MAX_REFERENCES):
            raise ValueError(f"D3 reference data for {reference.c6.shape[0]} elements, not {n}")
        dt = self.spec.torch_dtype
        for key in ("rcov", "r4r2", "c6", "cn_i", "cn_j"):
            self.register_buffer(key, getattr(reference, key).to(dt))

    def config(self) -> dict[str, Any]:
        return dict(self._config)

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> DFTD3:
        # the reference data come back through the state_dict
        n = len(config["elements"])
        return cls(**config, reference=D3Reference.placeholder(n))

    @classmethod
    def from_export_config(cls, config: dict[str, Any]) -> DFTD3:
        """What ``nvalchemi-lammps export`` builds from a TOML file with
        ``potential = "dftd3"``: the constructor's arguments (``elements``, ``cutoff``,
        ``cn_cutoff`` required) and ``parameter_file`` (a D3 data file in aimnet's layout;
        by default aimnet's own). The data of the model's elements go into the model file.
        """
        arguments = inspect.signature(cls.__init__).parameters
        allowed = [*(k for k in arguments if k not in ("self", "reference")), "parameter_file"]
        check_keys(config, "potential dftd3", allowed, ("elements", "cutoff", "cn_cutoff"))
        config = dict(config)
        parameter_file = config.pop("parameter_file", None)
        try:
            reference = D3Reference.from_file(list(config["elements"]), parameter_file)
        except ImportError as err:  # the CLI reports ValueErrors as one line
            raise ValueError(str(err)) from None
        return cls(**config, reference=reference)

    def prepare_compile(self) -> Potential:
        # NULL atoms and pairs beyond both cutoffs are masked already
        return self

    def coordination_numbers(self, graph: LocalGraph) -> torch.Tensor:
        """``(ntotal,)`` CN of every row from its own pairs (complete for owned atoms)."""
        si, sj = graph.species[graph.pair_i], graph.species[graph.pair_j]
        rsq = (graph.rij * graph.rij).sum(dim=1)
        counted = (rsq <= self.cn_cutoff_sq) & (si >= 0) & (sj >= 0)
        si, sj = si.clamp(min=0), sj.clamp(min=0)
        r = torch.sqrt(rsq) / self.bohr
        rcov = self.rcov[si] + self.rcov[sj]
        count = 1.0 / (1.0 + torch.exp(-K1 * (rcov / r - 1.0)))
        cn = torch.zeros(graph.ntotal, dtype=graph.rij.dtype, device=graph.rij.device)
        return cn.index_add(0, graph.pair_i, torch.where(counted, count, 0.0))

    def forward(self, graph: LocalGraph) -> torch.Tensor:
        # layer 1: coordination numbers; ghosts take their owners' (identity under "shell")
        cn = graph.comm.forward_exchange(self.coordination_numbers(graph)[:, None])[:, 0]

        # layer 2: C6 from both atoms' CN, then the damped pair energies
        si, sj = graph.species[graph.pair_i], graph.species[graph.pair_j]
        rsq = (graph.rij * graph.rij).sum(dim=1)
        inside = (rsq < self.cutoff_sq) & (si >= 0) & (sj >= 0)
        si, sj = si.clamp(min=0), sj.clamp(min=0)
        c6 = self._c6(si, sj, cn[graph.pair_i], cn[graph.pair_j])
        c8 = 3.0 * c6 * self.r4r2[si] * self.r4r2[sj]
        d = self.damping
        r0 = d["a1"] * torch.sqrt(3.0 * self.r4r2[si] * self.r4r2[sj]) + d["a2"]
        rsq_bohr = rsq / (self.bohr * self.bohr)
        r6 = rsq_bohr**3
        energy = d["s6"] * c6 / (r6 + r0**6) + d["s8"] * c8 / (r6 * rsq_bohr + r0**8)
        pair_energy = torch.where(inside, -self.hartree * energy, 0.0)
        # each directed pair carries half the pair energy to its receiver
        energies = torch.zeros(graph.ntotal, dtype=graph.rij.dtype, device=graph.rij.device)
        return energies.index_add(0, graph.pair_i, 0.5 * pair_energy)

    def _c6(
        self, si: torch.Tensor, sj: torch.Tensor, cn_i: torch.Tensor, cn_j: torch.Tensor
    ) -> torch.Tensor:
        """Gaussian-weighted average of the pair's reference ``C6`` (only references with
        ``C6 > 0``, as Grimme's code and LAMMPS), computed as a softmax so that the weights
        never underflow."""
        ref = self.c6[si, sj].flatten(1)
        di = cn_i[:, None] - self.cn_i[si, sj].flatten(1)
        dj = cn_j[:, None] - self.cn_j[si, sj].flatten(1)
        logits = (K3 * (di * di + dj * dj)).masked_fill(ref <= 0.0, float("-inf"))
        return (torch.softmax(logits, dim=1) * ref).sum(dim=1)
