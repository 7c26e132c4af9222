"""A small Levenberg-Marquardt least-squares search (scipy is not a dependency).

The residuals come from virtual runs, so there is no analytic Jacobian: it is taken by
forward differences of step h. Runs use common random numbers (fixed seeds), so the
residuals are a deterministic function of x; h is a few per cent so that a difference
spans more than one discrete event (a request ending just inside or outside a window).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

Vector = npt.NDArray[np.float64]
Residuals = Callable[[Vector], Vector]


@dataclass(frozen=True, slots=True)
class Solution:
    x: Vector
    residuals: Vector
    jacobian: Vector  # at x, as last computed (columns near 0: the data does not see that parameter)
    num_evaluations: int

    @property
    def cost(self) -> float:
        return float(self.residuals @ self.residuals)


def least_squares(
    f: Residuals, x0: Vector, h: float = 0.08, max_iterations: int = 12, bound: float = 7.0, settled: float = 0.02
) -> Solution:
    """x minimising |f(x)|^2, each coordinate kept within [-bound, bound].

    The Jacobian is taken once by differences, then updated by Broyden's rank-one rule
    after each step (one evaluation per step instead of one per parameter); it is taken
    again by differences when a step along it fails. Stops when a step moves no
    coordinate by more than `settled` (2% of a parameter: the noise of a virtual run's
    figures), or when no step along a fresh Jacobian helps."""
    x = np.clip(np.asarray(x0, dtype=float), -bound, bound)
    r = f(x)
    jac = _jacobian(f, x, r, h)
    evaluations = 1 + x.size
    damping, fresh, failures = 1e-2, True, 0
    for _ in range(max_iterations):
        step = np.clip(x + _solve(jac.T @ jac, jac.T @ r, damping), -bound, bound) - x
        r_new = f(x + step)
        evaluations += 1
        if r_new @ r_new < r @ r:
            was_fresh = fresh
            jac = jac + np.outer(r_new - r - jac @ step, step) / max(float(step @ step), 1e-300)
            x, r, fresh, failures = x + step, r_new, False, 0
            damping = max(damping / 3.0, 1e-6)
            if float(np.abs(step).max(initial=0.0)) < settled:
                if was_fresh:
                    break
                jac, fresh = _jacobian(f, x, r, h), True  # settled along an updated Jacobian: check it
                evaluations += x.size
        elif fresh:
            failures += 1
            if failures >= 3:
                break
            damping *= 4.0
        else:
            jac, fresh = _jacobian(f, x, r, h), True
            evaluations += x.size
    return Solution(x, r, jac, evaluations)


def standard_errors(solution: Solution) -> Vector:
    """Each coordinate's standard error from the Jacobian and the residuals' spread (inf where
    the data does not tell the coordinate apart from the others)."""
    jac, r = solution.jacobian, solution.residuals
    n, k = jac.shape
    if k == 0:
        return np.zeros(0)
    variance = float(r @ r) / max(n - k, 1)
    try:
        covariance = np.linalg.inv(jac.T @ jac) * variance
    except np.linalg.LinAlgError:
        return np.full(k, np.inf)
    errors: Vector = np.sqrt(np.clip(np.diag(covariance), 0.0, None))
    return errors


def _jacobian(f: Residuals, x: Vector, r: Vector, h: float) -> Vector:
    columns = []
    for i in range(x.size):
        shifted = x.copy()
        shifted[i] += h
        columns.append((f(shifted) - r) / h)
    return np.column_stack(columns) if columns else np.zeros((r.size, 0))


def _solve(normal: Vector, gradient: Vector, damping: float) -> Vector:
    scale = np.diag(normal).copy()
    scale[scale <= 0] = 1.0
    step: Vector = np.asarray(np.linalg.solve(normal + damping * np.diag(scale), -gradient), dtype=np.float64)
    return step
