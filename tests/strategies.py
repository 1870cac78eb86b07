"""Hypothesis strategies shared by the NumPy and PyTorch reference tests.

Shapes are small (0 to 4 axes of size 1 to 4) so every example runs in microseconds, and
values are bounded finite float64 so the reference formulas never overflow.  ``arrays``
can hand back a non-contiguous view (transposed, strided or reversed), which the engine
must treat exactly like a contiguous copy.
"""

from __future__ import annotations

import math

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

MAX_DIMS = 4
MAX_SIDE = 4

LAYOUTS = ("contiguous", "transposed", "strided", "reversed")


def shapes(min_dims: int = 0, max_dims: int = MAX_DIMS, min_side: int = 1,
           max_side: int = MAX_SIDE) -> st.SearchStrategy[tuple[int, ...]]:
    """Array shapes with ``min_dims``..``max_dims`` axes of size ``min_side``..``max_side``."""
    return hnp.array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=min_side,
                            max_side=max_side)


def _shrink(draw, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that broadcasts up to ``shape``: drop some leading axes, set some to 1."""
    drop = draw(st.integers(0, len(shape)))
    kept = shape[drop:]
    ones = draw(st.lists(st.booleans(), min_size=len(kept), max_size=len(kept)))
    return tuple(1 if one else n for n, one in zip(kept, ones, strict=True))


@st.composite
def broadcastable_to(draw, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that broadcasts up to ``shape`` without enlarging it (masks, expand)."""
    return _shrink(draw, tuple(shape))


@st.composite
def broadcastable_shapes(draw, num_shapes: int = 2, min_dims: int = 0,
                         max_dims: int = MAX_DIMS) -> tuple[tuple[int, ...], ...]:
    """``num_shapes`` shapes that broadcast together: each is a common full shape with some
    leading axes missing and some axes set to size 1."""
    full = draw(shapes(min_dims=min_dims, max_dims=max_dims))
    return tuple(_shrink(draw, full) for _ in range(num_shapes))


def elements(low: float = -3.0, high: float = 3.0,
             step: float | None = None) -> st.SearchStrategy[float]:
    """Finite floats in [low, high] (no NaN, inf or subnormals); with ``step``, only
    multiples of it, so equal entries (ties, equal operands) are common."""
    if step is not None:
        # sampled_from, not integers().map(): hnp.arrays fills arrays cheaply only from
        # strategies whose values it may reuse.
        return st.sampled_from([k * step for k in range(math.ceil(low / step),
                                                        math.floor(high / step) + 1)])
    return st.floats(low, high, allow_nan=False, allow_infinity=False, allow_subnormal=False)


def _layout_view(draw, shape: tuple[int, ...], layout: str, values) -> np.ndarray:
    """An array of ``shape`` laid out as ``layout``, filled from the ``values`` strategy."""
    ndim = len(shape)
    if layout == "contiguous" or ndim == 0:
        return draw(hnp.arrays(np.float64, shape, elements=values))
    if layout == "transposed":
        # Draw the reversed shape and transpose it back: a Fortran-ordered view.
        base = draw(hnp.arrays(np.float64, shape[::-1], elements=values))
        return base.T
    if layout == "strided":
        # Every other entry along the last axis of a twice-as-wide array.
        base = draw(hnp.arrays(np.float64, shape[:-1] + (2 * shape[-1],), elements=values))
        return base[..., ::2]
    if layout == "reversed":
        # Negative strides on every axis.
        base = draw(hnp.arrays(np.float64, shape, elements=values))
        return base[(slice(None, None, -1),) * ndim]
    raise ValueError(f"unknown layout {layout!r}")


@st.composite
def arrays(draw, shape: tuple[int, ...], low: float = -3.0, high: float = 3.0,
           layout: str | None = None, step: float | None = None) -> np.ndarray:
    """float64 arrays of ``shape`` with entries in [low, high] (multiples of ``step`` if
    given).

    ``layout`` picks the memory layout ("contiguous", "transposed", "strided",
    "reversed"); None draws one, so callers see non-contiguous inputs too.
    """
    if layout is None:
        layout = draw(st.sampled_from(LAYOUTS))
    return _layout_view(draw, tuple(shape), layout, elements(low, high, step))


@st.composite
def non_contiguous_arrays(draw, shape: tuple[int, ...], low: float = -3.0,
                          high: float = 3.0) -> np.ndarray:
    """A transposed, strided or reversed view of ``shape`` (never the plain layout)."""
    layout = draw(st.sampled_from(LAYOUTS[1:]))
    return _layout_view(draw, tuple(shape), layout, elements(low, high))


@st.composite
def nonzero_arrays(draw, shape: tuple[int, ...], min_abs: float = 0.5,
                   max_abs: float = 3.0) -> np.ndarray:
    """float64 arrays with |entries| in [min_abs, max_abs]: safe denominators."""
    magnitude = draw(arrays(shape, low=min_abs, high=max_abs))
    signs = draw(hnp.arrays(np.bool_, magnitude.shape))
    return np.where(signs, -magnitude, magnitude)


def positive_arrays(shape: tuple[int, ...], low: float = 0.5,
                    high: float = 3.0) -> st.SearchStrategy[np.ndarray]:
    """float64 arrays with entries in [low, high] (bases of ** and arguments of log)."""
    return arrays(shape, low=low, high=high)


@st.composite
def shaped_arrays(draw, min_dims: int = 0, max_dims: int = MAX_DIMS, low: float = -3.0,
                  high: float = 3.0, layout: str | None = None,
                  step: float | None = None) -> np.ndarray:
    """An array of a drawn shape (any layout unless ``layout`` is given)."""
    shape = draw(shapes(min_dims=min_dims, max_dims=max_dims))
    return draw(arrays(shape, low=low, high=high, layout=layout, step=step))


@st.composite
def reduce_axes(draw, ndim: int):
    """An ``axis`` argument for a reduction over ``ndim`` axes: None, an int (possibly
    negative) or a tuple of distinct ints (possibly negative, possibly empty)."""
    if ndim == 0:
        return None
    kind = draw(st.sampled_from(("none", "int", "tuple")))
    if kind == "none":
        return None
    if kind == "int":
        return draw(st.integers(-ndim, ndim - 1))
    chosen = draw(st.lists(st.integers(0, ndim - 1), unique=True, max_size=ndim))
    # Write some of the chosen axes as negative numbers.
    return tuple(a - ndim if draw(st.booleans()) else a for a in chosen)


@st.composite
def reshape_targets(draw, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A new shape with the same number of elements as ``shape``, maybe with one -1:
    the sides are shuffled and size-1 axes inserted or dropped."""
    sides = [n for n in shape if n != 1]
    sides = draw(st.permutations(sides))
    ones = draw(st.integers(0, 2))
    target = list(sides)
    for _ in range(ones):
        target.insert(draw(st.integers(0, len(target))), 1)
    if target and draw(st.booleans()):
        target[draw(st.integers(0, len(target) - 1))] = -1
    return tuple(target)


def basic_indices(shape: tuple[int, ...]):
    """NumPy basic indices for ``shape``: ints, slices (negative steps included), None and
    Ellipsis, alone or in a tuple."""
    return hnp.basic_indices(shape, min_dims=0, allow_newaxis=True, allow_ellipsis=True)


@st.composite
def slices(draw, side: int) -> slice:
    """A slice with any step, negative included, possibly empty, with negative or
    out-of-range bounds."""
    start = draw(st.none() | st.integers(-side - 1, side + 1))
    stop = draw(st.none() | st.integers(-side - 1, side + 1))
    step = draw(st.none() | st.integers(1, 3) | st.integers(-3, -1))
    return slice(start, stop, step)


@st.composite
def _composed_indices(draw, shape: tuple[int, ...]):
    """Ints and slices for some leading axes, maybe an Ellipsis and more for the trailing
    ones, maybe a None somewhere."""

    def part(side):
        return draw(st.integers(-side, side - 1) | slices(side))

    lead = draw(st.integers(0, len(shape)))
    parts = [part(side) for side in shape[:lead]]
    if draw(st.booleans()):
        trail = draw(st.integers(0, len(shape) - lead))
        parts += [Ellipsis] + [part(side) for side in shape[len(shape) - trail:]]
    if draw(st.booleans()):
        parts.insert(draw(st.integers(0, len(parts))), None)
    return tuple(parts)


def indices(shape: tuple[int, ...]):
    """Basic indices for ``shape``: hypothesis's own, and tuples built here whose slices
    have out-of-range bounds more often."""
    return basic_indices(shape) | _composed_indices(tuple(shape))


@st.composite
def integer_indices(draw, side: int, min_size: int = 1, max_size: int = 6) -> np.ndarray:
    """An int64 index array into an axis of length ``side``, often with repeats and
    negative entries."""
    values = draw(st.lists(st.integers(-side, side - 1), min_size=min_size, max_size=max_size))
    return np.asarray(values, dtype=np.int64)


def masks(shape: tuple[int, ...]) -> st.SearchStrategy[np.ndarray]:
    """Boolean arrays of ``shape``."""
    return hnp.arrays(np.bool_, shape)


@st.composite
def classification(draw, max_rows: int = 6, max_classes: int = 5):
    """(logits (N, C), target (N,), ignore_index or None) with at least one row kept."""
    rows = draw(st.integers(1, max_rows))
    classes = draw(st.integers(1, max_classes))
    logits = draw(arrays((rows, classes), layout="contiguous"))
    target = np.asarray(draw(st.lists(st.integers(0, classes - 1), min_size=rows,
                                      max_size=rows)), dtype=np.int64)
    ignore_index = draw(st.none() | st.sampled_from(sorted(set(target.tolist()))))
    if ignore_index is not None and np.all(target == ignore_index):
        ignore_index = None  # torch's 'mean' over zero rows is NaN; tested on its own
    return logits, target, ignore_index
