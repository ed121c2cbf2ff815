"""DirectML buffer tensor descriptions (tensorbits_protocol/dml.py): the worked sizes of
operators.md §2.2, every check_desc / check_placement rule with its message, and a property test
with hostile descriptions proving that a binding that passes never reaches outside its bound
range."""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, event, example, given, note, settings
from hypothesis import strategies as st

from tensorbits_protocol.dml import (
    DML_MINIMUM_BUFFER_TENSOR_ALIGNMENT,
    UINT32_MAX,
    UINT64_MAX,
    TensorDesc,
    ViewLayout,
    check_desc,
    check_placement,
    layout_of,
    minimum_implied_size,
)
from tensorbits_protocol.dtypes import DTYPES, DataType
from tensorbits_protocol.errors import InvalidRequest

U8, U16, U32, F32, F64 = (
    DataType.UINT8,
    DataType.UINT16,
    DataType.UINT32,
    DataType.FP32,
    DataType.FP64,
)


def bound_at(
    name: str, desc: TensorDesc, offset: int, buffer_size: int, *, buffer_name: str = "buffer"
) -> ViewLayout:
    """``desc`` bound at ``offset`` of a buffer, checked as the batch planner checks a binding
    (``layout_of``, then ``check_placement``): the view the checks passed."""
    layout = layout_of(name, desc)
    check_placement(name, layout, offset, buffer_size, buffer_name=buffer_name)
    return ViewLayout(offset, layout.shape, layout.byte_strides, layout.total_size)


def rejected(fn: Any, message: str, field: str, rule: str) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as info:
        fn()
    err = info.value
    assert message in err.message, err.message
    assert (err.field, err.rule, err.status_code) == (field, rule, 400)
    return err


# --- worked sizes --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("datatype", "sizes", "strides", "size"),
    [
        (U8, (2, 3), None, 8),
        (U8, (3,), None, 4),
        (U16, (1, 1, 3, 5), None, 32),
        (U8, (2, 3), (0, 1), 4),
        (F32, (4, 1), (1, 0), 16),
        (U8, (1,), None, 4),
    ],
)
def test_worked_sizes(
    datatype: DataType, sizes: tuple[int, ...], strides: tuple[int, ...] | None, size: int
) -> None:
    desc = TensorDesc(datatype, sizes, strides)
    assert minimum_implied_size(datatype, sizes, desc.effective_strides()) == size
    assert check_desc("InputTensor", desc) == size
    # The minimum itself is a valid TotalTensorSizeInBytes; one byte less is not.
    assert check_desc("InputTensor", TensorDesc(datatype, sizes, strides, total_size=size)) == size
    rejected(
        lambda: check_desc(
            "InputTensor", TensorDesc(datatype, sizes, strides, total_size=size - 1)
        ),
        f"InputTensor: TotalTensorSizeInBytes {size - 1} is below the minimum implied size {size}",
        "InputTensor.total_size",
        "total_size",
    )


def test_packed_strides_are_row_major() -> None:
    desc = TensorDesc(U8, (2, 3, 4))
    assert desc.packed_strides() == (12, 4, 1)
    assert desc.effective_strides() == (12, 4, 1)
    assert TensorDesc(U8, (2, 3), (0, 1)).effective_strides() == (0, 1)


def test_larger_total_size_is_kept() -> None:
    assert check_desc("ATensor", TensorDesc(U8, (3,), total_size=1000)) == 1000
    assert check_desc("ATensor", TensorDesc(U8, (3,), total_size=UINT64_MAX)) == UINT64_MAX


# --- check_desc rules ----------------------------------------------------------------------------
@pytest.mark.parametrize("rank", [0, 9])
def test_rank(rank: int) -> None:
    rejected(
        lambda: check_desc("ATensor", TensorDesc(U8, (1,) * rank)),
        f"ATensor: {rank} dimensions (allowed: 1 to 8)",
        "ATensor.sizes",
        "rank",
    )


@pytest.mark.parametrize("size", [0, -1, UINT32_MAX + 1, 2**64])
def test_size_out_of_range(size: int) -> None:
    rejected(
        lambda: check_desc("BTensor", TensorDesc(U8, (2, size), (0, 0))),
        f"BTensor: Sizes[1] = {size} (allowed: 1 to {UINT32_MAX})",
        "BTensor.sizes",
        "size",
    )


def test_element_count_limit() -> None:
    check_desc("ATensor", TensorDesc(U8, (UINT32_MAX,), (0,)))  # broadcast: 4 bytes hold it
    rejected(
        lambda: check_desc("ATensor", TensorDesc(U8, (65536, 65536), (0, 0))),
        f"ATensor: {2**32} elements (allowed: at most {UINT32_MAX} per tensor)",
        "ATensor.sizes",
        "size",
    )


def test_stride_count_must_match_rank() -> None:
    rejected(
        lambda: check_desc("ATensor", TensorDesc(U8, (2, 3), (1,))),
        "ATensor: 1 strides for 2 sizes (allowed: one stride per dimension)",
        "ATensor.strides",
        "strides",
    )


@pytest.mark.parametrize("stride", [-1, UINT32_MAX + 1, 2**64])
def test_stride_out_of_range(stride: int) -> None:
    rejected(
        lambda: check_desc("OutputTensor", TensorDesc(U16, (2, 3), (stride, 1))),
        f"OutputTensor: Strides[0] = {stride} (allowed: 0 to {UINT32_MAX}, in elements)",
        "OutputTensor.strides",
        "strides",
    )


@pytest.mark.parametrize(
    ("datatype", "alignment"), [(U8, 3), (U8, 24), (F64, 4), (U32, 2), (U8, -16)]
)
def test_bad_alignment(datatype: DataType, alignment: int) -> None:
    element = DTYPES[datatype].itemsize
    rejected(
        lambda: check_desc("ATensor", TensorDesc(datatype, (4,), alignment=alignment)),
        f"ATensor: GuaranteedBaseOffsetAlignment {alignment} (allowed: 0, or a power of two of "
        f"at least the element size {element})",
        "ATensor.alignment",
        "alignment",
    )


def test_total_size_too_large() -> None:
    rejected(
        lambda: check_desc("ATensor", TensorDesc(U8, (4,), total_size=UINT64_MAX + 1)),
        f"ATensor: TotalTensorSizeInBytes {UINT64_MAX + 1} is too large (allowed: 4 to "
        f"{UINT64_MAX})",
        "ATensor.total_size",
        "total_size",
    )


def test_negative_total_size() -> None:
    rejected(
        lambda: check_desc("ATensor", TensorDesc(U8, (4,), total_size=-4)),
        "ATensor: TotalTensorSizeInBytes -4 is below the minimum implied size 4",
        "ATensor.total_size",
        "total_size",
    )


# --- placement rules -----------------------------------------------------------------------------
def test_a_binding_has_byte_strides() -> None:
    layout = bound_at("ATensor", TensorDesc(F32, (2, 3), (4, 1)), 32, 64)
    assert layout == ViewLayout(offset=32, shape=(2, 3), byte_strides=(16, 4), total_size=28)
    assert layout.end == 60


@pytest.mark.parametrize("offset", [1, 8, 15, 17, -16])
def test_offset_must_be_multiple_of_16(offset: int) -> None:
    rejected(
        lambda: bound_at("ATensor", TensorDesc(U8, (4,)), offset, 1024),
        f"ATensor: byte offset {offset} into buffer is not a multiple of 16 (allowed: "
        "non-negative multiples of 16)",
        "ATensor.offset",
        "offset_alignment",
    )


def test_offset_must_be_multiple_of_larger_guaranteed_alignment() -> None:
    desc = TensorDesc(U8, (4,), alignment=64)
    bound_at("ATensor", desc, 128, 1024)
    rejected(
        lambda: bound_at("ATensor", desc, 32, 1024, buffer_name="input buffer 2"),
        "ATensor: byte offset 32 into input buffer 2 is not a multiple of 64 (allowed: "
        "non-negative multiples of 64)",
        "ATensor.offset",
        "offset_alignment",
    )
    # A smaller alignment than the DML minimum still means 16.
    rejected(
        lambda: bound_at("ATensor", TensorDesc(U8, (4,), alignment=4), 4, 1024),
        "not a multiple of 16",
        "ATensor.offset",
        "offset_alignment",
    )


def test_bound_range_must_fit_the_buffer() -> None:
    desc = TensorDesc(U16, (1, 1, 3, 5))  # 32 bytes
    assert bound_at("ATensor", desc, 32, 64).end == 64
    rejected(
        lambda: bound_at("ATensor", desc, 48, 64),
        "ATensor: bound range [48, 80) reaches past the end of buffer (64 bytes) (allowed: "
        "offset + TotalTensorSizeInBytes ≤ 64)",
        "ATensor.offset",
        "buffer_bounds",
    )
    rejected(
        lambda: bound_at("ATensor", TensorDesc(U8, (1,), total_size=2**64 - 1), 0, 2**20),
        "reaches past the end of buffer",
        "ATensor.offset",
        "buffer_bounds",
    )


def test_binding_runs_check_desc_first() -> None:
    rejected(
        lambda: bound_at("ATensor", TensorDesc(U8, (0,)), 0, 64),
        "ATensor: Sizes[0] = 0",
        "ATensor.sizes",
        "size",
    )


# --- hostile descriptions ------------------------------------------------------------------------
# A plausible description (often one that fits), with a hostile value injected into the fields
# that ``attack`` names, so that both accepted layouts (then read element by element) and every
# kind of rejection occur often.
HUGE = st.sampled_from([2**31, UINT32_MAX, 2**32, 2**63 - 1, 2**63, UINT64_MAX, 2**64, 2**70])
HOSTILE_INT = st.one_of(HUGE, st.integers(-(2**64), 2**65), st.integers(-3, 3))
ATTACKS = st.sets(
    st.sampled_from(["rank", "size", "stride", "stride_count", "total", "alignment", "offset"]),
    max_size=3,
)


@st.composite
def bound_descriptions(draw: st.DrawFn) -> tuple[TensorDesc, int, int]:
    attack = draw(st.one_of(st.just(set()), ATTACKS))
    datatype = draw(st.sampled_from(sorted(DTYPES, key=str)))
    element = DTYPES[datatype].itemsize
    rank = draw(st.integers(0, 9) if "rank" in attack else st.integers(1, 4))
    sizes = draw(st.lists(st.integers(1, 6), min_size=rank, max_size=rank))
    if "size" in attack and rank:
        sizes[draw(st.integers(0, rank - 1))] = draw(st.one_of(HOSTILE_INT, st.just(UINT32_MAX)))
    strides: list[int] | None = None
    if draw(st.booleans()) or {"stride", "stride_count"} & attack:
        n = draw(st.integers(0, 9)) if "stride_count" in attack else rank
        strides = draw(st.lists(st.integers(0, 9), min_size=n, max_size=n))
        if "stride" in attack and n:
            strides[draw(st.integers(0, n - 1))] = draw(HOSTILE_INT)
    alignment = draw(st.sampled_from([0, 0, 16, 32, 64, 8 * element if element > 1 else 16]))
    if "alignment" in attack:
        alignment = draw(st.one_of(st.sampled_from([1, 2, 3, 12, 24, -16, 2**40]), HOSTILE_INT))
    try:
        minimum = minimum_implied_size(
            datatype,
            tuple(sizes),
            tuple(strides)
            if strides is not None
            else TensorDesc(datatype, tuple(sizes)).packed_strides(),
        )
    except ValueError:  # zip(strict=True): a stride count that does not match
        minimum = 4
    total = draw(st.one_of(st.none(), st.integers(minimum, minimum + 64)))
    if "total" in attack:
        total = draw(st.one_of(HOSTILE_INT, st.integers(minimum - 8, minimum - 1)))
    step = max(16, alignment) if alignment > 0 else 16
    offset = step * draw(st.integers(0, 4))
    if "offset" in attack:
        offset = draw(st.one_of(HOSTILE_INT, st.integers(-64, 600)))
    need = offset + (total if total is not None else minimum)
    slack = draw(st.integers(-16, 64))
    buffer_size = (
        max(0, min(4096, need + slack)) if 0 <= need <= 4096 else draw(st.integers(0, 4096))
    )
    desc = TensorDesc(
        datatype,
        tuple(sizes),
        tuple(strides) if strides is not None else None,
        total_size=total,
        alignment=alignment,
    )
    return desc, offset, buffer_size


def _plan_or_error(desc: TensorDesc, offset: int, buffer_size: int) -> ViewLayout | InvalidRequest:
    try:
        return bound_at("ATensor", desc, offset, buffer_size)
    except InvalidRequest as err:
        return err


def _corners(shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    if math.prod(shape) <= 512:
        return list(itertools.product(*(range(n) for n in shape)))
    return list(itertools.product(*({0, n // 2, n - 1} for n in shape)))


@settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(bound=bound_descriptions(), seed=st.integers(0, 255))
@example((TensorDesc(U8, (UINT32_MAX,), (0,)), 0, 4), 0)
@example((TensorDesc(F64, (UINT32_MAX, 1), (0, 0)), 16, 64), 1)
@example((TensorDesc(U8, (UINT32_MAX, UINT32_MAX), (0, 0)), 0, 4), 0)
@example((TensorDesc(U8, (2**16,) * 8, (0,) * 8), 0, 4), 0)
@example((TensorDesc(U32, (3, 5), (7, 1), total_size=60), 32, 96), 2)
@example((TensorDesc(U16, (2, 2), (UINT32_MAX, 1)), 0, 1024), 3)
@example((TensorDesc(U8, (2,), (2**63,)), 0, 1024), 3)
# Sizes and strides implying more than a UINT64 of bytes, with a TotalTensorSizeInBytes below.
@example((TensorDesc(U8, (3,), (2**63,), total_size=1024), 0, 1024), 3)
@example((TensorDesc(U8, (4,), total_size=2**64), 0, 1024), 3)
@example((TensorDesc(U8, (4,), total_size=2**64 - 1), 0, 1024), 3)
@example((TensorDesc(F32, (4,), alignment=2**40), 0, 64), 3)
@example((TensorDesc(F32, (4,), alignment=2**40), 2**40, 2**41), 3)
def test_hostile_descriptions_never_escape_the_buffer(
    bound: tuple[TensorDesc, int, int], seed: int
) -> None:
    desc, offset, buffer_size = bound
    layout = _plan_or_error(desc, offset, buffer_size)
    if isinstance(layout, InvalidRequest):
        event(f"rejected: {layout.rule}")
        assert layout.status_code == 400
        assert layout.field is not None
        assert layout.field.startswith("ATensor.")
        assert layout.message.startswith("ATensor: ")
        assert "(allowed: " in layout.message
        if layout.rule == "total_size" and "is below the minimum" in layout.message:
            assert desc.total_size is not None
            assert desc.total_size < check_desc(
                "X", TensorDesc(desc.datatype, desc.sizes, desc.strides)
            )
        return
    event("accepted")
    note(f"layout {layout}")
    element = DTYPES[desc.datatype].itemsize
    # Layout facts, in Python's unbounded integers.
    assert layout.shape == desc.sizes
    assert layout.offset >= 0
    assert layout.offset % DML_MINIMUM_BUFFER_TENSOR_ALIGNMENT == 0
    if desc.alignment:
        assert layout.offset % desc.alignment == 0
    assert layout.end == layout.offset + layout.total_size <= buffer_size
    assert all(s >= 0 for s in layout.byte_strides)
    first = layout.offset
    last = layout.offset + sum(
        (n - 1) * s for n, s in zip(layout.shape, layout.byte_strides, strict=True)
    )
    assert layout.offset <= first
    assert last + element <= layout.end
    assert math.prod(layout.shape) <= UINT32_MAX

    if buffer_size > 1 << 20:
        return  # an explicit example with a terabyte buffer: the arithmetic above is the check
    # A real buffer of that size: the strided view builds and reads what the bytes say.
    rng = np.random.default_rng(seed)
    buffer = rng.integers(0, 256, buffer_size, dtype=np.uint8).tobytes()
    dtype = DTYPES[desc.datatype].bits  # the stored bits (a BOOL scalar would read as 0 or 1)
    base = np.frombuffer(buffer, dtype=dtype, count=1, offset=layout.offset)
    view = np.lib.stride_tricks.as_strided(
        base, shape=layout.shape, strides=layout.byte_strides, writeable=False
    )
    for index in _corners(layout.shape):
        start = layout.offset + sum(i * s for i, s in zip(index, layout.byte_strides, strict=True))
        assert layout.offset <= start
        assert start + element <= layout.end
        want = int.from_bytes(buffer[start : start + element], "little")
        got = int(view[index])
        assert got == want, index
