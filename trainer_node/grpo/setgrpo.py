"""SetGRPO's mathematics (seed 002), one pure function each; docs/SETGRPO.md derives them.

Notation for one group of K responses: s1, s2 in R^K are two grader draws of the same
responses; a(s) = (s - mean s) / (std s + eps) are GRPO's training coefficients (0 for a
zero-variance group); a_hat = a(s1) is the point coefficient; G = J J^T (K, K) is the group's
local update geometry, J's rows being the responses' policy-gradient features, so that the
group update u(a) = J^T a has <u(a), u(c)> = a^T G c.

(a) joint set      C = { c : ||c - a_hat|| <= q }, ||.|| the sup norm ("box", ours) or the
                   Euclidean norm ("sphere", the ablation); q the split-conformal quantile of the
                   nonconformity R = ||a(s1) - a(s2)|| over held-back calibration groups.
(b) recovery       a(eta) = a0 + eta (a_hat - a0) from the safe anchor a0 (the set's
                   sign-robust shrinkage of a_hat); eta* = the largest eta in [0, 1] whose worst
                   projection over C stays >= 0:  f(eta) = min_{c in C} a(eta)^T G c
                   = a(eta)^T G a_hat - q ||G a(eta)||_*  (dual norm: l1 for the box, l2 for the
                   sphere); f is concave, so {f >= 0} is an interval and bisection finds its end.
(c) risk gate      accept when rho = f(eta*) / (||a(eta*)||_G ||a_hat||_G) >= tau_sel and the
                   reward-space projection (G = I) is > 0; tau_sel comes from fixed-sequence
                   testing (Learn-then-Test): binomial tests of "conditional direction-reversal
                   risk > beta" down the grid from its most conservative threshold, each at the
                   full level delta, stopping at the first one not rejected (family-wise error
                   <= delta with no multiplicity cost).

Every quantity is invariant under s -> a s + b (a > 0): a(s) is, so q, a0, eta*, rho are.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

SET_SHAPES = ("box", "sphere")
_BISECTION_STEPS = 30  # eta to 1e-9: far below any tolerance that matters


def standardise(scores: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """GRPO's coefficients of one group: (s - mean) / (unbiased std + eps); 0 when all equal."""
    s = scores.to(torch.float64)
    if s.numel() < 2 or float(s.max() - s.min()) == 0.0:
        return torch.zeros_like(s)
    return (s - s.mean()) / (s.std() + eps)


def set_norm(v: torch.Tensor, shape: str) -> float:
    """The norm whose ball is the coefficient set: sup norm (box) or Euclidean (sphere)."""
    return float(v.abs().max()) if shape == "box" else float(v.norm())


def dual_norm(v: torch.Tensor, shape: str) -> float:
    """max_{||d|| <= 1} <v, d> for the set's norm: l1 (box) or l2 (sphere)."""
    return float(v.abs().sum()) if shape == "box" else float(v.norm())


def nonconformity(a1: torch.Tensor, a2: torch.Tensor, shape: str) -> float:
    """How far the reference draw's coefficients are from the point ones (one number per group:
    the set is joint over the group's K coefficients, not K marginal intervals)."""
    return set_norm(a1 - a2, shape)


def conformal_quantile(scores: Sequence[float], alpha: float) -> float:
    """The ceil((n + 1)(1 - alpha))-th smallest score (inf when that rank exceeds n): a fresh
    exchangeable score is <= it with probability >= 1 - alpha (split conformal)."""
    n = len(scores)
    rank = math.ceil((n + 1) * (1.0 - alpha))
    if rank > n:
        return math.inf
    return float(sorted(scores)[rank - 1])


def safe_anchor(a_hat: torch.Tensor, q: float, shape: str) -> torch.Tensor:
    """The most conservative member of the set that keeps a_hat's direction in reward space:
    soft-thresholding by q (box: every nonzero coordinate has the sign of every member's), or
    radial shrinkage by q (sphere). Its reward-space worst projection is >= 0 by construction."""
    if shape == "box":
        return a_hat.sign() * (a_hat.abs() - q).clamp(min=0.0)
    norm = float(a_hat.norm())
    return a_hat * max(1.0 - q / norm, 0.0) if norm > 0 else torch.zeros_like(a_hat)


def worst_projection(a: torch.Tensor, a_hat: torch.Tensor, gram: torch.Tensor, q: float, shape: str) -> float:
    """min over c in C(a_hat, q) of a^T G c  =  a^T G a_hat - q ||G a||_*."""
    ga = gram @ a
    return float(ga @ a_hat) - q * dual_norm(ga, shape)


def geometry_norm(a: torch.Tensor, gram: torch.Tensor) -> float:
    return math.sqrt(max(float(a @ gram @ a), 0.0))


def normalised_projection(a: torch.Tensor, a_hat: torch.Tensor, gram: torch.Tensor, q: float, shape: str) -> float:
    """The worst projection scaled to [-1, 1]-ish: f / (||a||_G ||a_hat||_G); -inf for a zero update."""
    scale = geometry_norm(a, gram) * geometry_norm(a_hat, gram)
    if scale <= 1e-300:
        return -math.inf
    return worst_projection(a, a_hat, gram, q, shape) / scale


@dataclass(frozen=True)
class Recovery:
    eta: float              # the recovery ratio eta* in [0, 1]
    coefficients: torch.Tensor  # a(eta*) (K,)
    feasible: bool          # the anchor itself is safe in this geometry


def recover(a_hat: torch.Tensor, gram: torch.Tensor, q: float, shape: str, anchor_only: bool = False) -> Recovery:
    """(b): the largest eta in [0, 1] with worst_projection(a(eta)) >= 0 (tolerance relative to
    the scale of f); infeasible (eta 0, the anchor) when the anchor itself fails."""
    a_hat = a_hat.to(torch.float64)
    gram = gram.to(torch.float64)
    anchor = safe_anchor(a_hat, q, shape)
    if not math.isfinite(q):
        return Recovery(0.0, torch.zeros_like(a_hat), False)
    tol = 1e-9 * max(geometry_norm(a_hat, gram) ** 2, 1e-300)

    def f(eta: float) -> float:
        return worst_projection(anchor + eta * (a_hat - anchor), a_hat, gram, q, shape)

    if f(0.0) < -tol:
        return Recovery(0.0, anchor, False)
    if anchor_only:
        return Recovery(0.0, anchor, True)
    if f(1.0) >= -tol:
        return Recovery(1.0, a_hat.clone(), True)
    low, high = 0.0, 1.0  # f(low) >= 0 > f(high); concavity: the safe set is [0, root]
    for _ in range(_BISECTION_STEPS):
        mid = 0.5 * (low + high)
        if f(mid) >= -tol:
            low = mid
        else:
            high = mid
    return Recovery(low, anchor + low * (a_hat - anchor), True)


def binomial_cdf(failures: int, trials: int, p: float) -> float:
    """P(Binomial(trials, p) <= failures)."""
    if trials == 0 or failures >= trials:  # (the ordering split's margin can ask for one more than trials)
        return 1.0
    total = 0.0
    log_p, log_q = math.log(p), math.log1p(-p)
    for k in range(failures + 1):
        total += math.exp(math.lgamma(trials + 1) - math.lgamma(k + 1) - math.lgamma(trials - k + 1)
                          + k * log_p + (trials - k) * log_q)
    return min(total, 1.0)


@dataclass(frozen=True)
class Threshold:
    tau: float           # tau_sel (inf: no threshold certified, nothing is accepted)
    accepted: int        # calibration groups accepted at tau_sel (N)
    reversals: int       # direction reversals among them (F)

    @property
    def empirical_risk(self) -> float:
        return self.reversals / self.accepted if self.accepted else math.nan


def certificate_size(beta: float, delta: float) -> int:
    """The fewest accepted calibration groups that can certify a threshold: with 0 reversals the
    binomial p-value is (1 - beta)^N, <= delta iff N >= log(delta) / log(1 - beta)."""
    return math.ceil(math.log(delta) / math.log1p(-beta) - 1e-12)


def sequence_start(order: Sequence[tuple[float, bool]], test_size: int, beta: float, delta: float,
                   grid: Sequence[float]) -> float:
    """Where the fixed sequence begins, chosen on an ordering split independent of the test
    records (Pareto testing, Laufer-Goldshtein et al. 2023: choose on one split, test on the
    other): the tau of the grid whose binomial p-value the ordering split's own records
    (rho, reversed) predict smallest, scaled to `test_size` records and with one reversal more
    (a margin for the test split's chance); ties go to the more conservative tau. Starting higher
    would meet a threshold that holds too few test records, which cannot be rejected and would
    stop the sequence before the promising ones are tested. The lowest tau without records."""
    ordered = sorted(grid, reverse=True)
    best, best_p = float(ordered[-1]), math.inf
    if order and test_size:
        ratio = test_size / len(order)
        for tau in ordered:
            accepted = [rev for rho, rev in order if rho >= tau]
            n = round(len(accepted) * ratio)
            p = binomial_cdf(round(sum(accepted) * ratio) + 1, n, beta) if n else 1.0
            if p < best_p:
                best, best_p = float(tau), p
    return best


def select_threshold(records: Sequence[tuple[float, bool]], beta: float, delta: float,
                     grid: Sequence[float], start: float = math.inf) -> Threshold:
    """(c): records are (rho, reversed) of risk-calibration groups. For each candidate tau, H_tau:
    "the reversal risk of groups with rho >= tau is > beta", rejected when the binomial p-value
    P(Bin(N_tau, beta) <= F_tau) <= delta. Fixed-sequence testing (Learn-then-Test, Angelopoulos
    et al. 2021): the hypotheses are tested in an order fixed before the records are seen, from
    the most conservative threshold (the grid's largest tau <= `start`) down, each at the full
    level delta, and testing stops at the first one not rejected. A false certificate needs the
    first true null met to be rejected, which happens with probability <= delta, so with
    probability >= 1 - delta every certified threshold is right (family-wise error <= delta, no
    Bonferroni split). tau_sel is the last certified threshold (the loosest); inf when the first
    is not certified (nothing is accepted). `start` must not depend on the records' reversals
    (see `sequence_start`)."""
    chosen = Threshold(math.inf, 0, 0)
    for tau in sorted((t for t in grid if t <= start), reverse=True):
        accepted = [rev for rho, rev in records if rho >= tau]
        n, f = len(accepted), sum(accepted)
        if not n or binomial_cdf(f, n, beta) > delta:
            break
        chosen = Threshold(float(tau), n, f)
    return chosen
