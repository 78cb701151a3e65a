"""e3nn's tensor products with each input split once, instead of sliced once per irrep.

e3nn generates a tensor product's code with ``torch.fx``: one column slice of an input per
irrep it holds and of the weights per path (``x[:, a:b]``), then scripts it. In the
backward pass every slice costs a zero-filled tensor of its input's full size, and autograd
adds them up. In MACE's convolution the inputs have one row per pair, so this is the
largest memory traffic of the backward pass (at 19,652 atoms on the CPU, 73 of 558 ms per
call zero-filling; 237 aten ops more than split, of 3,395) and, on a GPU, a kernel per
slice and per add.

Here each input that is sliced into adjacent pieces is split once (``split_with_sizes``):
the same views, whose backward joins the gradients in one tensor. Every element of the
input's gradient has exactly one nonzero term either way, so energies and forces are the
same to the last bit (tests/test_mace.py). The code is generated again from the tensor
product's own description, rewritten, scripted as e3nn does, and kept only if it gives
e3nn's output exactly on a few random rows. Modules whose code is not TorchScript (e3nn's
code generation turned off, as for ``torch.compile``, which fuses the slices itself), and
every module where e3nn's code generator is not where this module looks for it, are left
as they are.
"""

from __future__ import annotations

import itertools
import operator
from typing import Any

import torch
from torch import fx

from ..._quiet import without_torchscript_warnings

__all__ = ["split_tensor_product_inputs"]


def split_tensor_product_inputs(network: torch.nn.Module) -> int:
    """Rewrite the scripted code of every e3nn ``TensorProduct`` in ``network`` (in place)
    so that each input is split once; returns how many were rewritten. Run it before the
    network changes dtype or device: the new code's constants are made in torch's default
    dtype on the CPU, as e3nn makes them, and follow the module from then on."""
    from e3nn import o3

    try:
        from e3nn.o3._tensor_product._codegen import codegen_tensor_product_left_right
        from opt_einsum_fx import jitable
    except ImportError:  # another e3nn: its own code runs
        return 0

    rewritten = 0
    for module in network.modules():
        if not isinstance(module, o3.TensorProduct):
            continue
        code = getattr(module, "_compiled_main_left_right", None)
        options = [getattr(module, k, None) for k in ("_specialized_code", "_optimize_einsums")]
        if not isinstance(code, torch.jit.ScriptModule) or None in options:
            continue  # not TorchScript, or another e3nn's module
        graph = codegen_tensor_product_left_right(
            module.irreps_in1,
            module.irreps_in2,
            module.irreps_out,
            module.instructions,
            module.shared_weights,
            *options,
        )
        if not _split_column_slices(graph.graph):
            continue
        graph.recompile()
        with without_torchscript_warnings():
            split = torch.jit.script(jitable(graph))
        if _same_output(module, code, split):
            module._compiled_main_left_right = split
            rewritten += 1
    return rewritten


def _same_output(module: Any, code: torch.nn.Module, split: torch.nn.Module) -> bool:
    """``split`` gives what ``code`` gives, to the last bit, on three random rows."""
    generator = torch.Generator().manual_seed(0)
    rows = () if module.shared_weights else (3,)
    inputs = [
        torch.randn(3, module.irreps_in1.dim, generator=generator),
        torch.randn(3, module.irreps_in2.dim, generator=generator),
        torch.randn(*rows, module.weight_numel, generator=generator),
    ]
    try:
        return torch.equal(code(*inputs), split(*inputs))
    except RuntimeError:  # e.g. slices that do not reach the last column
        return False


def _column_range(node: fx.Node) -> tuple[int, int] | None:
    """``(a, b)`` when ``node`` is ``x[:, a:b]`` with both ends given, else ``None``."""
    if node.op != "call_function" or node.target is not operator.getitem:
        return None
    index = node.args[1]
    if not (isinstance(index, tuple) and len(index) == 2 and index[0] == slice(None)):
        return None
    columns = index[1]
    if not isinstance(columns, slice) or columns.step is not None or columns.stop is None:
        return None
    return columns.start or 0, columns.stop


def _split_column_slices(graph: fx.Graph) -> int:
    """Replace the column slices of each tensor that has several, when they are adjacent
    pieces from column 0 on (what e3nn generates), by one ``split_with_sizes`` and its
    items; returns the number of slices replaced. The slices must end at the tensor's last
    column: ``split_with_sizes`` checks that the sizes add up to it when the code runs."""
    replaced = 0
    for source in list(graph.nodes):
        slices: list[tuple[fx.Node, Any]] = [
            (user, r) for user in source.users if (r := _column_range(user)) is not None
        ]
        if len(slices) < 2:
            continue
        bounds = sorted({0, *(end for _, r in slices for end in r)})
        pieces = list(itertools.pairwise(bounds))
        if any(r not in pieces for _, r in slices):
            continue  # overlapping slices: left as they are
        with graph.inserting_after(source):
            parts = graph.call_method(
                "split_with_sizes", (source, [b - a for a, b in pieces]), {"dim": 1}
            )
        for node, r in slices:
            with graph.inserting_after(parts):
                item = graph.call_function(operator.getitem, (parts, pieces.index(r)))
            node.replace_all_uses_with(item)
            graph.erase_node(node)
        replaced += len(slices)
    graph.lint()
    return replaced
