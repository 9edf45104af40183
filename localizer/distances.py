"""The two distances of the method, as pure vectorized numpy (DESIGN.md section 6).

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
    return per_dim.sum(axis=0)


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


def normalize_by_max(values: np.ndarray) -> np.ndarray:
    """P̂ = P / max over workers, per dimension; a dimension whose max is 0 stays 0. (3, N) -> (3, N)."""
    x = np.asarray(values, dtype=np.float64)
    out = np.zeros_like(x)
    for d in range(x.shape[0]):
        mx = float(x[d].max()) if x.shape[1] else 0.0
        if mx > 0.0:
            np.divide(x[d], mx, out=out[d])
    return out


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
    y = x[:, sample]
    idx = np.arange(x.shape[1]) if rows is None else np.asarray(rows)
    out = np.zeros(idx.size, dtype=np.int64)
    m = max(1, y.shape[1])
    step = max(1, _BLOCK_ELEMENTS // m)
    for start in range(0, idx.size, step):
        part = idx[start:start + step]
        d = np.abs(x[0, part, None] - y[0, None, :])
        d += np.abs(x[1, part, None] - y[1, None, :])
        d += np.abs(x[2, part, None] - y[2, None, :])
        out[start:start + step] = np.count_nonzero(d > eps, axis=1)
    return out


def differential_distance(normalized: np.ndarray, sample: np.ndarray, eps: float,
                          grid_cells: int = 32) -> np.ndarray:
    """D_diff, exactly equal to ``differential_distance_blocks`` but computed per grid cell.

    normalized: (3, N) with values in [0, 1]; sample: indices of S. Returns (N,) int64.
    """
    x = np.asarray(normalized, dtype=np.float64)
    n = x.shape[1]
    sample = np.asarray(sample, dtype=np.int64)
    if n == 0 or sample.size == 0:
        return np.zeros(n, dtype=np.int64)
    g = int(grid_cells)
    y = x[:, sample]  # (3, m)

    # cell of each worker, per dimension, and the flat cell id
    cell_id = np.zeros(n, dtype=np.int32)
    for d in range(3):
        c = (x[d] * g).astype(np.int32)
        np.clip(c, 0, g - 1, out=c)
        cell_id *= g
        cell_id += c
    occupancy = np.bincount(cell_id, minlength=g ** 3)
    cells = np.flatnonzero(occupancy)
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

    lut_count = np.zeros(g ** 3, dtype=np.int64)
    lut_count[cells] = cell_count
    counts = lut_count[cell_id]
    if cell_undecided.any():
        lut_undecided = np.zeros(g ** 3, dtype=bool)
        lut_undecided[cells[cell_undecided]] = True
        rows = np.flatnonzero(lut_undecided[cell_id])
        counts[rows] = differential_distance_blocks(x, sample, eps, rows=rows)
    return counts
