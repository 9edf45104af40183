"""Materiality floors of the differential test, per profile (GPU vs CPU), and where each comes from.

The paper's differential test is scale-free: P̂ = P / max, then a count of ε-far peers, then
median + k·MAD. Three floors keep noise from passing it (docs/design.md section 6); each profile has its
own values, because what is noise differs between a GPU job measured by CUPTI and NVML and a
CPU-only job measured by a 1 kHz thread-CPU sampler on a shared host.

1. **Normalization floor** (``distances.normalization_maxima``): P̂ = P / max(max, m / ε) per
   dimension, with m the dimension's materiality (``material_beta`` for β,
   ``material_utilization`` for μ and σ). A difference smaller than m can then never exceed ε on
   its own, while a function that only one worker runs with β > m is still ε-far from the others.
2. **Material-shift gate** (``localize.material_shift``): a worker the test singles out must also
   differ from the median worker by at least ``shift_units · m`` in some dimension, and on the GPU
   profile by more than ``shift_z`` robust standard deviations of that dimension over the workers
   (MAD / Φ⁻¹(3/4)) in that same dimension.
3. **Degenerate-MAD margin** (``rule.differential_threshold``): when more than half of the workers
   share one D_diff count, the threshold is median + ``mad_margin`` · |S|.

**CPU (measured, unchanged).** m_β = 0.01, m_u = 0.1, the shift gate equal to the normalization
floors (0.01 / ε = 0.025 of the window in β, 0.1 / ε = 0.25 in μ and σ), mad_margin = 0.25.
Measured on clean 4-rank CPU runs of perftracker/examples/train.py on the 2-core bench host (fault bench):
CPU utilization of one op 0.5-0.6 and within-op σ of 0.02-0.07 swinging from rank to rank with
scheduling luck; a NIC μ of 1.8e-5 on one rank and 0 on the others; a Python frame at β 0.0108
against 0.0097 with μ 0.44 against 0.34 that P / max made ε-far from all three other ranks. Each of
these was a false finding before its floor; see the docstrings of ``normalization_maxima`` and
``material_shift`` and the tests that pin them (tests/unit/test_localize.py, tests/unit/test_distances.py).

**GPU (reasoned, then checked on synthetic jobs; not measured on GPU hardware).**
- m_β = 0.01, shift 0.01 (shift_units = 1): β comes from CUPTI kernel timestamps (ns), so a
  kernel's β varies between ranks only with the work itself, not with the measurement; the paper's
  own materiality, β_min = 1% of the window, is the smallest difference worth a finding. A kernel
  only one rank runs at β 1.5% is therefore a finding (it was not under the CPU gate of 2.5%).
- m_u = 0.05, shift 0.05: NVML reports SM utilization as an integer percent per driver sample
  (every 1/6 to 1/50 s); μ of a function is a mean over the samples its executions overlap, which
  for a function that recurs every iteration of a 20 s window is 100-1,000 samples, so
  quantization (±0.5 points) and sampling luck (a per-sample spread of 10-20 points over √n)
  leave μ uncertain by about 1-2 points; nsys at 10 kHz is finer. 5 points is above that with a
  margin, and below the paper's GPU cases (a NIC collective at μ 0.10 against 0.20, a σ of 0.25
  against 0.06, a throttled GPU at 60% of its peers' utilization).
- shift_z = 5, for jobs of more than 16 workers (the MAD test): GPU noise between workers is relative (a collective's μ varies by a few percent of
  its value), so no absolute gate fits every level: 5 points is 2.3 standard deviations of an
  AllReduce at μ 0.55 in the synthetic job, but 12 of a NIC collective at μ 0.20. Measured on clean
  synthetic jobs (``bench.synthetic``, 100 seeds each) with the absolute gate alone, the tail
  workers of the AllReduce reached D_diff = 11 of |S| = 100 at N = 100 and 25 at N = 1,000 against
  a median of 0; with the robust z > 5 as well, 0 at N = 100 and 1,000 and at most 5 at N = 10,000
  (5 seeds). The paper's cases are far beyond it (a throttled GEMM's μ ×0.6 is 30 deviations).
  Small jobs (the per-N count of ``rule.small_job_threshold``) do without it: a robust deviation from
  8 workers is mostly their real spread, and on the real 8-rank dlrm traces it hid two ranks whose
  AllReduce was 0.13× the others' (ε-far from all six others) because the six varied by ±20%.
- mad_margin = 0.1: a group of g of the workers that differs from the rest has D_diff ≈ (1 − g)·|S|
  against a median of g·|S|, so the margin flags every group below (1 − margin) / 2 = 45% of the
  job (the paper's 40% case; 0.25 stopped at 37.5%). The z gate above keeps clean jobs' tails
  below it; bench/localize_small_n.py and docs/localizer-rule.md give the false-positive rates.

Where to re-measure: a clean multi-GPU job profiled by the agent with NVML and with nsys; the
spread of μ and σ between ranks of the same function sets m_u, as the CPU runs set the CPU value.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ProfileFloors:
    """The three floors of one profile (see the module doc for their origin)."""

    name: str
    material_beta: float  # m_β: share of the window
    material_utilization: float  # m_u: share of the device's peak, for μ and σ
    shift_units: float | None  # material-shift gate = shift_units · m; None: the normalization floor m / ε
    mad_margin: float  # degenerate MAD: threshold >= median + mad_margin · |S|
    shift_z: float = 0.0  # the shift must also exceed this many robust deviations of the dimension (0: off)


CPU_FLOORS = ProfileFloors("cpu", material_beta=0.01, material_utilization=0.1, shift_units=None, mad_margin=0.25)
GPU_FLOORS = ProfileFloors("gpu", material_beta=0.01, material_utilization=0.05, shift_units=1.0, mad_margin=0.1,
                           shift_z=5.0)
PROFILE_FLOORS = {"cpu": CPU_FLOORS, "gpu": GPU_FLOORS}


@dataclass(frozen=True)
class Floors:
    """The floors resolved for one localization: per-dimension arrays (β, μ, σ)."""

    profile: str
    normalization: np.ndarray  # (3,) denominators' floor of P̂: m / ε
    shift: np.ndarray  # (3,) the material-shift gate
    mad_margin: float
    shift_z: float = 0.0


def floors_for(profile: str, eps: float, material_beta: float | None = None,
               material_utilization: float | None = None, mad_margin: float | None = None) -> Floors:
    """The floors of ``profile`` ("gpu" or "cpu"; anything else: "cpu", the stricter), with
    optional overrides of m_β, m_u and the margin. eps <= 0 turns the floors off."""
    base = PROFILE_FLOORS.get(profile, CPU_FLOORS)
    mb = base.material_beta if material_beta is None else material_beta
    mu = base.material_utilization if material_utilization is None else material_utilization
    margin = base.mad_margin if mad_margin is None else mad_margin
    m = np.array([mb, mu, mu], dtype=np.float64)
    if eps <= 0:
        return Floors(base.name, np.zeros(3), np.zeros(3), margin, base.shift_z)
    shift = m / eps if base.shift_units is None else m * base.shift_units
    return Floors(base.name, m / eps, shift, margin, base.shift_z)
