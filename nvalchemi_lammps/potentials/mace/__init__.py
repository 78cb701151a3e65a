"""MACE (mace-torch) on a LocalGraph, with ghost features exchanged between layers.

The potential runs the blocks of a mace-torch ``MACE`` or ``ScaleShiftMACE`` itself, in the
order of their own ``forward``: E0s, node embedding, spherical harmonics and radial
embedding of the edges, then per layer an interaction block and a product basis block, then
the readouts (and scale/shift). With the exchange strategy (ghost rows refreshed from their
owners) the interaction blocks exchange the ghosts' features themselves, as in mace-torch's
LAMMPS ML-IAP path (``InteractionBlock.handle_lammps``, after ``linear_up``), through
``graph.comm``, and update the owned rows only. Otherwise (a single process, ``NoOpComm``;
the widened shell, whose exchange is the identity and whose ghosts compute their own
features) the potential calls ``graph.comm.forward_exchange`` on the node features between
layers, which is the same thing for the owned atoms because ``linear_up`` acts on each atom
on its own.

mace-torch is an optional dependency (``pip install 'nvalchemi-lammps[mace]'``), imported
only when a MACE model is built. The network runs on e3nn's kernels or on cuEquivariance's
(``kernels``): the weights are kept, saved and loaded in e3nn's form, and the cuEquivariance
network is made from them with mace-torch's own converter (``mace.cli.convert_e3nn_cueq``)
for the device the potential is moved to, then checked against the e3nn network. A model
built or converted with cuEquivariance is converted back to e3nn's form when exported
(``mace.cli.convert_cueq_e3nn``). OpenEquivariance models are refused.

The model file holds the MACE hyperparameters as plain data (:meth:`Mace.config`) and the
weights as tensors; loading it rebuilds the network from mace-torch's classes and never
unpickles anything. A mace-torch checkpoint, by contrast, is a pickled Python object:
:meth:`Mace.from_checkpoint` runs code from the file, so use it only on files you trust, and
export them once to a model file.

The package's modules: :mod:`._mace_torch` (importing mace-torch without its side effects),
:mod:`._kernels` (e3nn or cuEquivariance, and the conversions between them), :mod:`._config`
(hyperparameters <-> plain data, the network rebuilt from them), :mod:`._tensor_product_splits`
(e3nn's tensor products splitting each input once), :mod:`._potential` (:class:`Mace`) and
:mod:`._forward` (the blocks on a LocalGraph, with the ghost exchange).
"""

# _mace (mace-torch, imported once) and _cueq_available stay reachable here for the tests
# that build mace-torch models themselves
from ._config import MODEL_CLASSES, READOUT_CLASSES, build_model, model_config
from ._kernels import KERNELS
from ._kernels import _cueq_available as _cueq_available
from ._mace_torch import _mace as _mace
from ._potential import Mace

__all__ = ["KERNELS", "MODEL_CLASSES", "READOUT_CLASSES", "Mace", "build_model", "model_config"]
