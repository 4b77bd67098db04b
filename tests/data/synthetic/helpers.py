"""Shared constructions of the rpm.data.synthetic tests."""

from __future__ import annotations

import itertools

import torch

from rpm.data.synthetic import CONDITIONALS, MARGINALS, SPACES, LatentProcess

ALPHA = 1e-3  # Kolmogorov-Smirnov test level


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def valid_settings() -> list[tuple[str, str, str]]:
    out = []
    for space, marginal, conditional in itertools.product(SPACES, MARGINALS, CONDITIONALS):
        if (space == "unbounded" and marginal == "uniform") or (
                conditional == "vmf" and space != "sphere"):
            continue
        out.append((space, marginal, conditional))
    return out


def make(space: str, marginal: str, conditional: str, dim: int = 4, **kw) -> LatentProcess:
    if conditional == "anisotropic":
        kw.setdefault("concentrations", "5,25")
    return LatentProcess(dim=dim, space=space, marginal=marginal, conditional=conditional, **kw)


def truncated_cdf(ref, centre):
    """The CDF of the law ``ref`` shifted to ``centre`` and truncated to [-1, 1]."""
    lo, hi = ref.cdf(-1 - centre), ref.cdf(1 - centre)
    return lambda x: (ref.cdf(x - centre) - lo) / (hi - lo)
