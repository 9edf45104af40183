"""The two distances of the method, as pure vectorized numpy (docs/design.md section 6).

Arrays hold one function's patterns for all workers as shape (3, N): rows β, μ, σ.

``differential_distance`` is exact: it returns the same counts as the obvious block computation
(``differential_distance_blocks``) for every input, bit for bit. It is fast because most workers of
a job sit in a few tight clusters: the unit cube is cut into a grid, and for each occupied grid cell
and each sampled worker s the L1 distance from s to the whole cell is bounded below and above.
Where every s is decided for the cell (surely farther than ε, or surely not), all workers of the cell
get the cell's count at once; only workers in cells that straddle some ε-sphere are compared one by
one, with the very expression the block computation uses.
"""

from __future__ import annotations

import numpy as np

# Decisions at the cell level keep this margin from ε, far above float64 rounding of sums of three
# terms in [0, 1] (~1e-16), so a cell decision never disagrees with the per-worker expression.
_MARGIN = 1e-9
_BLOCK_ELEMENTS = 1 << 20  # rows × |S| per block of the exact comparison (~8 MB of float64)


def distance_from_expectation(values: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """D_exp: the L1 distance from each worker's pattern to the box [lo, hi], Σ_dim max(0, lo−x, x−hi).

    values: (3, N); lo, hi: (3,). Returns (N,) float64.
    """
    x = np.asarray(values, dtype=np.float64)
    lo = np.asarray(lo, dtype=np.float64).reshape(3, 1)
    hi = np.asarray(hi, dtype=np.float64).reshape(3, 1)
    per_dim = np.maximum(np.maximum(lo - x, x - hi), 0.0)
    out: np.ndarray = per_dim.sum(axis=0)
    return out


def outside_expectation(values: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """D_exp > 0, computed without the sum: (N,) bool. Dimensions whose range is [0, 1] are skipped."""
    x = np.asarray(values, dtype=np.float64)
    out = np.zeros(x.shape[1], dtype=bool)
    for d in range(3):
        if lo[d] > 0.0:
            out |= x[d] < lo[d]
        if hi[d] < 1.0:
            out |= x[d] > hi[d]
    return out


def normalize_by_max(values: np.ndarray, floor: float | np.ndarray = 0.0) -> np.ndarray:
    """P̂ = P / max(max over workers, floor), per dimension; a dimension whose max is 0 stays 0.
    (3, N) -> (3, N). ``floor`` is the materiality floor (``normalization_maxima``)."""
    x = np.asarray(values, dtype=np.float64)
    out = np.zeros_like(x)
    floors = np.broadcast_to(np.asarray(floor, dtype=np.float64), (x.shape[0],))
    for d in range(x.shape[0]):
        mx = max(float(x[d].max()), float(floors[d])) if x.shape[1] else 0.0
        if mx > 0.0:
            np.divide(x[d], mx, out=out[d])
    return out


def normalization_maxima(values: np.ndarray, floor: float | np.ndarray) -> np.ndarray:
    """The per-dimension denominators of P̂: max over workers, but at least ``floor``.

    **[decision] Materiality floor.** P / max is scale-free, so when every worker's value of a
    dimension is tiny (a function at 1.5% of the window, a NIC at 0.002% of its peak) measurement
    noise is blown up to the whole [0, 1] range and one worker looks unique. The floor is
    ``material_difference / ε`` (0.01 / 0.4 = 0.025): a difference smaller than the rule's own
    materiality (β_min = 1% of the window, or 1% of a device's peak utilization) can then never
    exceed ε on its own, while a function that only one worker runs with β > β_min is still farther
    than ε from the workers that do not run it (β / 0.025 > 0.4). Above the floor, P / max is unchanged.

    **[decision] Utilization floor.** μ and σ get their own floor, ``material_utilization / ε``
    (0.1 / 0.4 = 0.25; ``LocalizeOptions.material_utilization``): a difference of less than 10 points
    of a device's peak utilization is not material on its own. Measured on clean 4-rank CPU runs (2
    cores), a function with the same β on every rank read CPU utilizations of 0.5-0.6 and within-op σ
    of 0.02-0.07 that swung from rank to rank with scheduling luck; divided by a max of 0.07, one
    rank's σ became 1.0 against 0.3 and made it unique. A 1 kHz sampler over a function that holds
    1-5% of a 5-20 s window has tens of independent samples, so its μ is uncertain by several points.
    A throttled device (the paper's case: 45% of the others' utilization) is far above the floor.
    """
    x = np.asarray(values, dtype=np.float64)
    mx = x.max(axis=1) if x.shape[1] else np.zeros(x.shape[0])
    floors = np.broadcast_to(np.asarray(floor, dtype=np.float64), mx.shape)
    return np.where(mx > 0.0, np.maximum(mx, floors), 0.0)


def sample_workers(n_workers: int, sample_size: int, seed: int) -> np.ndarray:
    """The seeded random sample S of worker indices, |S| = min(N, sample_size), sorted."""
    m = min(n_workers, sample_size)
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(n_workers, size=m, replace=False)).astype(np.int64)


def differential_distance_blocks(normalized: np.ndarray, sample: np.ndarray, eps: float,
                                 rows: np.ndarray | None = None) -> np.ndarray:
    """D_diff by the definition: for each worker, the number of sampled workers s with
    ‖P̂_w − P̂_s‖₁ > ε, computing the full (rows × |S|) distance matrix in blocks.

    normalized: (3, N) P̂; sample: indices of S; rows: the workers to compute (default all).
    Returns (len(rows),) int64.
    """
    x = np.asarray(normalized, dtype=np.float64)
    p = x if rows is None else x[:, np.asarray(rows)]
    return _count_far(p, x[:, sample], eps)


def _count_far(p: np.ndarray, y: np.ndarray, eps: float) -> np.ndarray:
    """For each column of p (3, R): how many columns of y (3, m) are farther than eps in L1."""
    out = np.zeros(p.shape[1], dtype=np.int64)
    step = max(1, _BLOCK_ELEMENTS // max(1, y.shape[1]))
    for start in range(0, p.shape[1], step):
        part = p[:, start:start + step]
        d = np.abs(part[0, :, None] - y[0, None, :])
        d += np.abs(part[1, :, None] - y[1, None, :])
        d += np.abs(part[2, :, None] - y[2, None, :])
        out[start:start + step] = np.count_nonzero(d > eps, axis=1)
    return out


def _normalize_columns(x: np.ndarray, maxima: np.ndarray | None, cols: np.ndarray) -> np.ndarray:
    """P̂ of some workers, exactly as normalize_by_max computes it (elementwise x / max)."""
    sub = x[:, cols]
    if maxima is None:
        return sub
    out = np.zeros_like(sub)
    for d in range(3):
        if maxima[d] > 0.0:
            np.divide(sub[d], maxima[d], out=out[d])
    return out


def differential_distance(values: np.ndarray, sample: np.ndarray, eps: float,
                          grid_cells: int = 32, refine_cells: int = 256,
                          maxima: np.ndarray | None = None) -> np.ndarray:
    """D_diff, exactly equal to ``differential_distance_blocks`` but computed per grid cell.

    values: (3, N), already normalized (P̂, in [0, 1]) when ``maxima`` is None; otherwise the raw
    patterns, with ``maxima`` their per-dimension maxima: P̂ = values / maxima is then formed only for
    the sample and the workers compared one by one, and grid cells come from values · (g / max).
    Workers whose cell at ``grid_cells`` per dimension is undecided get a second pass at
    ``refine_cells``; only those still undecided are compared one by one. Both must be powers of two.
    Returns (N,) int64.
    """
    x = np.asarray(values, dtype=np.float64)
    n = x.shape[1]
    sample = np.asarray(sample, dtype=np.int64)
    if n == 0 or sample.size == 0:
        return np.zeros(n, dtype=np.int64)
    mx = None if maxima is None else np.asarray(maxima, dtype=np.float64)
    y = _normalize_columns(x, mx, sample)  # (3, m)
    unit = np.ones(3) if mx is None else np.divide(1.0, mx, out=np.zeros(3), where=mx > 0)
    counts, undecided = _grid_pass(x, unit, y, eps, int(grid_cells))
    rows = np.flatnonzero(undecided)
    if rows.size and refine_cells > grid_cells:
        sub_counts, sub_undecided = _grid_pass(x[:, rows], unit, y, eps, int(refine_cells))
        counts[rows] = sub_counts
        rows = rows[sub_undecided]
    if rows.size:
        counts[rows] = _count_far(_normalize_columns(x, mx, rows), y, eps)
    return counts


def _grid_pass(x: np.ndarray, unit: np.ndarray, y: np.ndarray, eps: float, g: int
               ) -> tuple[np.ndarray, np.ndarray]:
    """Per-worker counts where the worker's grid cell decides every sampled worker, and a mask of
    the workers whose cell does not (their count is to be computed another way).

    A worker's cell index is floor(x · unit · g · (1 − 2⁻⁴⁰)): P̂ lies within ~1e-12 of that cell, and
    the cell decisions keep a margin of 1e-9 from ε, so this never changes a decision."""
    n = x.shape[1]
    cell_id: np.ndarray = np.zeros(n, dtype=np.int64 if g > 1024 else np.int32)
    shrink = 1.0 - 2.0 ** -40  # keeps x = max inside the last cell without a clamp pass
    for d in range(3):
        c = (x[d] * (unit[d] * g * shrink)).astype(cell_id.dtype)
        cell_id *= g
        cell_id += c
    cells, cell_id = _occupied(cell_id, g)
    cx, rest = np.divmod(cells, g * g)
    cy, cz = np.divmod(rest, g)

    # per dimension and grid index: min and max |x_d - s_d| over the cell's interval, for every s
    edges = np.arange(g + 1, dtype=np.float64) / g
    lo, hi = edges[:-1, None], edges[1:, None]  # (g, 1)
    dmin, dmax = [], []
    for d in range(3):
        s = y[d][None, :]  # (1, m)
        dmin.append(np.maximum(np.maximum(lo - s, s - hi), 0.0))  # (g, m)
        dmax.append(np.maximum(np.abs(s - lo), np.abs(s - hi)))
    near = dmax[0][cx] + dmax[1][cy] + dmax[2][cz]  # (cells, m): upper bound on the distance
    far = dmin[0][cx] + dmin[1][cy] + dmin[2][cz]  # lower bound
    surely_far = far > eps + _MARGIN
    surely_near = near <= eps - _MARGIN
    cell_count = np.count_nonzero(surely_far, axis=1)
    cell_undecided = ~(surely_far | surely_near).all(axis=1)
    return cell_count[cell_id], cell_undecided[cell_id]


def _occupied(cell_id: np.ndarray, g: int) -> tuple[np.ndarray, np.ndarray]:
    """(occupied cell ids sorted, each worker's index into them)."""
    if g ** 3 <= 4 * cell_id.size + (1 << 16):  # a dense table is cheaper than sorting
        occupancy = np.bincount(cell_id, minlength=g ** 3)
        cells = np.flatnonzero(occupancy)
        lut = np.zeros(g ** 3, dtype=np.int32)
        lut[cells] = np.arange(cells.size, dtype=np.int32)
        return cells, lut[cell_id]
    cells, inverse = np.unique(cell_id, return_inverse=True)
    return cells, inverse


def exact_median(x: np.ndarray) -> float:
    """np.median(x) of a 1-D float array without NaN, exactly, in a few linear passes for large x:
    a bracket around the median from a strided subsample, then a partition of the bracket only."""
    x = np.asarray(x)
    n = x.size
    if n < 50_000:
        return float(np.median(x))
    sub = np.sort(x[:: n // 2048])
    m = sub.size
    half = int(4 * np.sqrt(m)) + 8
    lo, hi = sub[max(m // 2 - half, 0)], sub[min(m // 2 + half, m - 1)]
    below = int(np.count_nonzero(x < lo))
    k_lo, k_hi = (n - 1) // 2 - below, n // 2 - below
    inside = x[(x >= lo) & (x <= hi)]
    if k_lo < 0 or k_hi >= inside.size:  # the bracket missed (very skewed data): the plain way
        return float(np.median(x))
    part = np.partition(inside, [k_lo, k_hi])
    return float(np.mean(part[[k_lo, k_hi]]))
