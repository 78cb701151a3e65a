"""fairchem checkpoint files (``uma-s-1p1.pt``, ...) read into :class:`~.uma.Uma`'s plain
configuration and weights.

A fairchem inference checkpoint is a pickled ``MLIPInferenceCheckpoint``: the model's hydra
configuration (``model_config``: backbone, heads, ``model_id``), its weights and their
exponential moving average (``ema_state_dict``, which fairchem's predict unit runs), and the
tasks (``tasks_config``: per dataset, the energy's normalizer and element references). It
is read here the way the predict unit reads it (``load_inference_model(use_ema=True)``,
then the tasks instantiated), so it is unpickled: only read files you trust.

What is taken: the backbone (``eSCNMDBackbone`` or the mixture of experts
``eSCNMDMoeBackbone``) with its configuration; the one energy head (``MLP_EFS_Head``, bare
or in ``DatasetSpecificSingleHeadWrapper``, or ``DatasetSpecificMoEWrapper``: an expert per
dataset); per dataset with an energy task, the normalizer's ``rmsd`` and ``mean`` and the
element references. What is refused, with a message: direct-force models, any other head,
and forces normalized otherwise than the energy (the predict unit's forces would then not
be the gradient of its energy, which is what LAMMPS integrates).
"""

from __future__ import annotations

import copy
import warnings
from pathlib import Path
from typing import Any

import torch

from .._quiet import without_warp_banner

_EFS_HEADS = ("MLP_EFS_Head", "MLP_Energy_Head")


def read_checkpoint(path: str | Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The :class:`~.uma.Uma` constructor arguments that describe the checkpoint at
    ``path`` (``backbone``, ``head_experts``, ``normalization``, ``model_id``; not
    ``elements``, ``task``, ``spin``, ``dtype``) and its weights as ``Uma``'s state dict.

    :raises ValueError: no such file, or a model this potential does not run
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"UMA checkpoint {path} not found")
    # fairchem itself was imported quietly by the caller (uma._escn_md: no import circle)
    import hydra
    from fairchem.core.units.mlip_unit.utils import load_inference_model

    with without_warp_banner(), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        try:
            model, checkpoint = load_inference_model(str(path), use_ema=True)
        except Exception as err:  # noqa: BLE001  (pickles fail in many ways)
            raise ValueError(f"cannot read UMA checkpoint {path}: {err}") from None
        tasks = [hydra.utils.instantiate(t) for t in checkpoint.tasks_config]
    network = model.module
    if network.backbone.regress_config.direct_forces:
        raise ValueError(
            f"UMA checkpoint {path} is a direct-force model; only energy-conserving models "
            "(forces = -dE/dx) are supported"
        )
    config = _plain(checkpoint.model_config)
    head_experts, energy_block = _energy_head(network, config.get("heads", {}), path)
    state = {f"backbone.{k}": v for k, v in network.backbone.state_dict().items()}
    state.update({f"energy_block.{k}": v for k, v in energy_block.state_dict().items()})
    backbone = dict(config["backbone"])
    # how fairchem executes the model (its GPU kernels), not what it computes: the general
    # backend here, as fairchem's predict unit on the CPU
    backbone.pop("execution_mode", None)
    arguments = {
        "backbone": backbone,
        "head_experts": head_experts,
        "normalization": _normalization(tasks, path),
        "model_id": config.get("model_id"),
    }
    return arguments, {k: v.detach().clone() for k, v in state.items()}


def _plain(config: Any) -> Any:
    """An omegaconf configuration (as some checkpoints hold) as plain dicts and lists."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf
    except ImportError:  # pragma: no cover - fairchem depends on omegaconf
        return copy.deepcopy(config)
    if isinstance(config, (DictConfig, ListConfig)):
        return OmegaConf.to_container(config, resolve=True)
    if isinstance(config, dict):
        return {k: _plain(v) for k, v in config.items()}
    if isinstance(config, (list, tuple)):
        return [_plain(v) for v in config]
    return config


def _energy_head(
    network: torch.nn.Module, heads: dict[str, Any], path: Path
) -> tuple[dict[str, str] | None, torch.nn.Module]:
    """The head's dataset mapping if it has an expert per dataset (else ``None``) and its
    energy MLP."""
    from fairchem.core.models.uma.escn_md import resolve_dataset_mapping

    if len(network.output_heads) != 1:
        raise ValueError(
            f"UMA checkpoint {path} has heads {', '.join(sorted(network.output_heads))}; "
            "only models with one energy head are supported"
        )
    ((name, head),) = network.output_heads.items()
    kind = type(head).__name__
    inner = head.head if kind.startswith("DatasetSpecific") else head
    if type(inner).__name__ not in _EFS_HEADS:
        raise ValueError(
            f"UMA checkpoint {path}: head {name} ({kind} of {type(inner).__name__}) is not "
            f"supported (supported: {', '.join(_EFS_HEADS)}, bare or in "
            "DatasetSpecificSingleHeadWrapper or DatasetSpecificMoEWrapper)"
        )
    if kind != "DatasetSpecificMoEWrapper":
        return None, inner.energy_block
    config = heads.get(name, {})
    mapping = resolve_dataset_mapping(
        config.get("dataset_names"), config.get("dataset_mapping"), "dataset_names"
    )
    return dict(mapping), inner.energy_block


def _normalization(tasks: list[Any], path: Path) -> dict[str, dict[str, Any]]:
    """Per dataset: the energy task's normalizer and element references, as the predict
    unit applies them; forces and stress tasks of the dataset must be normalized alike."""
    energies = {}
    for task in tasks:
        if task.property != "energy":
            continue
        references = task.element_references
        if references is not None and not hasattr(references, "undo_refs"):
            raise ValueError(
                f"UMA checkpoint {path}: task {task.name} has element references of type "
                f"{type(references).__name__}, which the predict unit cannot undo"
            )
        for dataset in task.datasets:
            energies[dataset] = {
                "rmsd": float(task.normalizer.rmsd),
                "mean": float(task.normalizer.mean),
                "element_references": (
                    None if references is None else references.element_references.double().tolist()
                ),
            }
    if not energies:
        raise ValueError(f"UMA checkpoint {path} has no energy task")
    for task in tasks:
        if task.property not in ("forces", "stress"):
            continue
        for dataset in task.datasets:
            energy = energies.get(dataset)
            if energy is None:
                continue
            rmsd, mean = float(task.normalizer.rmsd), float(task.normalizer.mean)
            if rmsd != energy["rmsd"] or mean != 0.0:
                raise ValueError(
                    f"UMA checkpoint {path}: task {task.name} is normalized with rmsd {rmsd:g} "
                    f"and mean {mean:g}, the {dataset} energy with rmsd {energy['rmsd']:g}: "
                    "its forces are not the gradient of its energy"
                )
    return energies
