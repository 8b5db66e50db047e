"""Noise present at the declared std: R repeated single-candidate releases of one checkpoint."""

from __future__ import annotations

import numpy as np

from protocol.conformance.context import SuiteContext
from protocol.conformance.noise_stats import UPPER_SLACK, lower_std_threshold, upper_std_threshold
from protocol.conformance.registry import check, expect


def noise_samples(ctx: SuiteContext) -> list[float]:
    """R released accuracies of the suite's checkpoint (shared by both noise checks)."""
    if ctx.noise_values is None:
        ctx.require_dp()
        releases = ctx.options.noise_releases
        ctx.require_releases(releases, f"the noise check ({releases} releases)")
        checkpoint_id = ctx.checkpoint_id()
        ctx.noise_values = [ctx.release([checkpoint_id]).results[0].accuracy for _ in range(releases)]
    return ctx.noise_values


@check(
    "privacy.noise.present",
    title="Released values carry at least the declared noise",
    rationale="""R single-candidate releases of the same checkpoint (fresh request ids) must not be identical, and
    their sample std must reach the alpha-quantile (alpha = 0.1%, i.e. a 0.1% false-failure rate) of the sample
    std of R draws of clamp(mu + noise_std * Z, 0, 1), minimised over mu in [0, 1] (seeded Monte Carlo). Only a
    lower bound is sound here, and it must account for clamping: clamping to [0, 1] shrinks the spread near the
    ends (a checkpoint scoring 0 releases max(0, Z)), while the fresh Poisson subsample of every release only
    adds spread. The suite's random checkpoint scores 0 everywhere, where the bound is exact.""",
    order=75,
)
def noise_present(ctx: SuiteContext) -> str:
    values = np.asarray(noise_samples(ctx))
    sigma, alpha = ctx.info().privacy.noise_std, ctx.options.noise_alpha
    expect(len(set(values.tolist())) > 1, f"all {len(values)} releases returned the identical value {values[0]!r}: no noise")
    observed = float(values.std(ddof=1))
    threshold = lower_std_threshold(sigma, len(values), alpha)
    expect(observed >= threshold,
           f"sample std {observed:.4g} of {len(values)} releases is below {threshold:.4g}, the {alpha:.2%} quantile "
           f"for the declared noise_std {sigma:.4g}: the server adds less noise than it declares")
    return f"sample std {observed:.4g} >= {threshold:.4g} (declared noise_std {sigma:.4g}, R={len(values)})"


@check(
    "privacy.noise.not_excessive",
    title="Released values are not far noisier than declared (loose upper bound)",
    rationale=f"""A declared std that understates the real noise misleads the trainer's statistics. Clamping is
    1-Lipschitz, so Var <= noise_std^2 + (1-q)/(qN) (the Poisson subsample's variance with scores in [0, 1]);
    the sample std of the same R releases must stay below the chi-square (1 - alpha) quantile of that, times a
    slack of {UPPER_SLACK} for the non-normal subsample part. Loose by design: it only catches gross miscalibration.""",
    order=76,
)
def noise_not_excessive(ctx: SuiteContext) -> str:
    values = np.asarray(noise_samples(ctx))
    info = ctx.info()
    q = info.privacy
    observed = float(values.std(ddof=1))
    threshold = upper_std_threshold(q.noise_std, q.sample_rate, info.heldout_size, len(values), ctx.options.noise_alpha)
    expect(observed <= threshold, f"sample std {observed:.4g} exceeds the loose bound {threshold:.4g} "
                                  f"(declared noise_std {q.noise_std:.4g})")
    return f"sample std {observed:.4g} <= {threshold:.4g}"
