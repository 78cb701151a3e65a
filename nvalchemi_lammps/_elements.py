from __future__ import annotations

#: What ``pair_coeff`` writes for a LAMMPS type this pair style does not handle.
NULL_ELEMENT = "NULL"


def map_elements(names: list[str], model_elements: tuple[str, ...] | list[str]) -> list[int]:
    """Model element index for each LAMMPS type, from ``pair_coeff * * <names>``.

    Names match exactly (case-sensitive). ``NULL`` maps to -1; several types may map to the
    same element.

    :raises ValueError: naming the unknown element and listing the model's elements
    """
    index = {e: k for k, e in enumerate(model_elements)}
    mapped = []
    for name in names:
        if name == NULL_ELEMENT:
            mapped.append(-1)
        elif name in index:
            mapped.append(index[name])
        else:
            raise ValueError(f"element {name} not in model ({', '.join(model_elements)})")
    return mapped
