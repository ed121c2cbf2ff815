"""DirectML buffer tensor descriptions and bindings, and the bounds checks that make views safe.

A description (data type, Sizes, optional Strides in elements, TotalTensorSizeInBytes,
GuaranteedBaseOffsetAlignment) bound at a byte offset of a caller's buffer becomes a strided view.
Everything is checked first with Python's unbounded integers, so no product or sum can overflow,
and a binding passes only when every element lies inside the bound range. The check is two
steps: ``layout_of`` checks a description on its own (the same description bound at many offsets
is checked once) and ``check_placement`` checks one offset into one buffer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

from tensorbits_protocol.dtypes import DataType, itemsize
from tensorbits_protocol.errors import InvalidRequest
from tensorbits_protocol.integers import UINT32_MAX as UINT32_MAX
from tensorbits_protocol.integers import UINT64_MAX as UINT64_MAX

DML_MINIMUM_BUFFER_TENSOR_ALIGNMENT = 16
MAX_DIMENSIONS = 8


@dataclass(frozen=True, slots=True)
class TensorDesc:
    """DML_BUFFER_TENSOR_DESC, with sizes and strides in elements."""

    datatype: DataType
    sizes: tuple[int, ...]
    strides: tuple[int, ...] | None = None
    total_size: int | None = None  # TotalTensorSizeInBytes; None: the minimum implied size
    alignment: int = 0  # GuaranteedBaseOffsetAlignment; 0: none beyond the DML minimum

    def packed_strides(self) -> tuple[int, ...]:
        strides: list[int] = []
        step = 1
        for size in reversed(self.sizes):
            strides.append(step)
            step *= size
        return tuple(reversed(strides))

    def effective_strides(self) -> tuple[int, ...]:
        return self.strides if self.strides is not None else self.packed_strides()


@dataclass(frozen=True, slots=True)
class ViewLayout:
    """Where a validated tensor lies in its buffer: a byte offset, and strides in bytes."""

    offset: int
    shape: tuple[int, ...]
    byte_strides: tuple[int, ...]
    total_size: int  # bytes of the bound range [offset, offset + total_size)

    @property
    def end(self) -> int:
        return self.offset + self.total_size


@dataclass(frozen=True, slots=True)
class DescLayout:
    """A description that passed ``check_desc``: its elements' layout relative to the offset it is
    bound at (shape, strides in bytes, the bytes it claims), and what binding it needs.

    Equal layouts read the same elements from the same offset; the fields after ``total_size``
    follow from the description and take no part in equality."""

    datatype: DataType
    shape: tuple[int, ...]
    byte_strides: tuple[int, ...]
    total_size: int  # TotalTensorSizeInBytes, given or implied
    alignment: int = field(compare=False)  # a bound offset must be a multiple of this
    itemsize: int = field(compare=False)
    elements: int = field(compare=False)
    # Row-major without gaps (the stride of a dimension of size 1 is never used): the elements
    # are the ``elements`` consecutive ones from the bound offset, a plain slice of the buffer.
    packed: bool = field(compare=False)


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def minimum_implied_size(
    datatype: DataType, sizes: tuple[int, ...], strides: tuple[int, ...]
) -> int:
    """roundup((Σ (Sizes[i] − 1) · Strides[i] + 1) · element size, 4), as DirectML defines it."""
    last_index = sum((size - 1) * stride for size, stride in zip(sizes, strides, strict=True))
    return _round_up((last_index + 1) * itemsize(datatype), 4)


@lru_cache(maxsize=4096)  # pure; a batch of many small dispatches repeats a few descriptions
def _check_each(
    name: str, what: str, values: tuple[int, ...], low: int, rule: str, unit: str = ""
) -> None:
    """Every one of ``values`` (a description's Sizes or Strides) in [low, UINT32_MAX]."""
    for axis, value in enumerate(values):
        if not low <= value <= UINT32_MAX:
            raise InvalidRequest(
                f"{name}: {what}[{axis}] = {value} (allowed: {low} to {UINT32_MAX}{unit})",
                field=f"{name}.{what.lower()}",
                rule=rule,
            )


def check_desc(name: str, desc: TensorDesc) -> int:
    """Check a description on its own; return its TotalTensorSizeInBytes (given or implied)."""
    rank = len(desc.sizes)
    if not 1 <= rank <= MAX_DIMENSIONS:
        raise InvalidRequest(
            f"{name}: {rank} dimensions (allowed: 1 to {MAX_DIMENSIONS})",
            field=f"{name}.sizes",
            rule="rank",
        )
    _check_each(name, "Sizes", desc.sizes, 1, "size")
    elements = math.prod(desc.sizes)
    if elements > UINT32_MAX:
        # DirectML's limit per buffer tensor; it also keeps every view within what NumPy and
        # CuPy can index (Sizes of up to 2^32 - 1 in 8 dimensions would need 2^256 elements).
        raise InvalidRequest(
            f"{name}: {elements} elements (allowed: at most {UINT32_MAX} per tensor)",
            field=f"{name}.sizes",
            rule="size",
        )
    if desc.strides is not None:
        if len(desc.strides) != rank:
            raise InvalidRequest(
                f"{name}: {len(desc.strides)} strides for {rank} sizes "
                "(allowed: one stride per dimension)",
                field=f"{name}.strides",
                rule="strides",
            )
        _check_each(name, "Strides", desc.strides, 0, "strides", ", in elements")
    element = itemsize(desc.datatype)
    if desc.alignment != 0 and (desc.alignment & (desc.alignment - 1) or desc.alignment < element):
        raise InvalidRequest(
            f"{name}: GuaranteedBaseOffsetAlignment {desc.alignment} (allowed: 0, or a power "
            f"of two of at least the element size {element})",
            field=f"{name}.alignment",
            rule="alignment",
        )
    minimum = minimum_implied_size(desc.datatype, desc.sizes, desc.effective_strides())
    if minimum > UINT64_MAX:
        # No TotalTensorSizeInBytes can be right: say so, not a range whose ends cross.
        raise InvalidRequest(
            f"{name}: the sizes and strides imply at least {minimum} bytes (allowed: at most "
            f"{UINT64_MAX}, TotalTensorSizeInBytes being a UINT64)",
            field=f"{name}.total_size",
            rule="total_size",
        )
    total = minimum if desc.total_size is None else desc.total_size
    if not minimum <= total <= UINT64_MAX:
        why = f"is below the minimum implied size {minimum}" if total < minimum else "is too large"
        raise InvalidRequest(
            f"{name}: TotalTensorSizeInBytes {total} {why} (allowed: {minimum} to {UINT64_MAX})",
            field=f"{name}.total_size",
            rule="total_size",
        )
    return total


def is_packed(shape: tuple[int, ...], byte_strides: tuple[int, ...], element: int) -> bool:
    """Whether the elements are row-major and contiguous, as a plain slice reshaped would be."""
    step = element
    for size, stride in zip(reversed(shape), reversed(byte_strides), strict=True):
        if size != 1:
            if stride != step:
                return False
            step *= size
    return True


def layout_of(name: str, desc: TensorDesc) -> DescLayout:
    """Check a description on its own (``check_desc``, errors named after ``name``) and lay it
    out."""
    total = check_desc(name, desc)
    element = itemsize(desc.datatype)
    byte_strides = tuple(s * element for s in desc.effective_strides())
    return DescLayout(
        datatype=desc.datatype,
        shape=desc.sizes,
        byte_strides=byte_strides,
        total_size=total,
        alignment=max(DML_MINIMUM_BUFFER_TENSOR_ALIGNMENT, desc.alignment),
        itemsize=element,
        elements=math.prod(desc.sizes),
        packed=is_packed(desc.sizes, byte_strides, element),
    )


def check_placement(
    name: str, layout: DescLayout, offset: int, buffer_size: int, *, buffer_name: str = "buffer"
) -> None:
    """Check a described tensor bound at ``offset`` of a buffer of ``buffer_size`` bytes: on
    success every element's byte range lies in [offset, offset + total) ⊆ [0, buffer_size)."""
    alignment = layout.alignment
    if offset < 0 or offset % alignment:
        raise InvalidRequest(
            f"{name}: byte offset {offset} into {buffer_name} is not a multiple of {alignment} "
            f"(allowed: non-negative multiples of {alignment})",
            field=f"{name}.offset",
            rule="offset_alignment",
        )
    total = layout.total_size
    if offset + total > buffer_size:
        raise InvalidRequest(
            f"{name}: bound range [{offset}, {offset + total}) reaches past the end of "
            f"{buffer_name} ({buffer_size} bytes) (allowed: offset + TotalTensorSizeInBytes "
            f"≤ {buffer_size})",
            field=f"{name}.offset",
            rule="buffer_bounds",
        )
