"""The options of ``localize`` (``perftracker.localizer.diagnose.localize``), read by ``findings`` too."""

from __future__ import annotations

from dataclasses import dataclass

from perftracker.localizer.diagnose.evidence.waits import WaitOptions
from perftracker.localizer.diagnose.method.expect import Expectations


@dataclass(frozen=True)
class LocalizeOptions:
    eps: float = 0.4  # L1 radius in the max-normalized pattern space
    k: float = 5.0  # MAD multiplier
    beta_min: float = 0.01  # a function must hold more than this share of the window
    # the floors (perftracker.localizer.diagnose.method.floors); None: the profile's value (gpu / cpu)
    mad_floor_margin: float | None = None  # degenerate MAD: threshold >= median + margin·|S| (rule.py)
    material_difference: float | None = None  # m_β: P̂ = P / max(max, m_β / eps), shift gate
    material_utilization: float | None = None  # m_u: the same for μ and σ
    small_job_max: int = 16  # N <= this: the exact per-N test over all workers (rule.small_job_threshold)
    small_job_share: float = 0.75  # ... flags a worker ε-far from at least this share of its peers
    sample_size: int = 100  # |S| = min(N, sample_size); all workers when N <= small_job_max
    seed: int = 0  # seeds the sample S
    profile: str | None = None  # "gpu" | "cpu"; None: "gpu" if any worker saw GPU activity
    expect_path: str | None = None  # a user TOML file (--expect FILE); None: the built-in file
    expectations: Expectations | None = None  # already loaded; overrides profile / expect_path
    common_fraction: float = 0.5  # a finding on more than this share of the workers is "common"
    max_points: int = 500  # (rank, β, μ) points kept per finding for plots
    top_functions: int = 5
    grid_cells: int = 32  # cells per dimension of the exact D_diff grid (a power of two)
    refine_cells: int = 256  # second, finer grid for the workers the first leaves undecided
    method: str = "grid"  # "grid" (exact, fast) | "blocks" (the definition, full matrix)
    trigger_reason: str = ""
    created_ns: int | None = None  # None: now
    waits: WaitOptions = WaitOptions()  # who waits for whom (localizer/diagnose/evidence/waits.py)
