"""Small networks and constructors shared by the tests."""

import torch


class GaussianHead(torch.nn.Module):
    """x -> (loc, scale): a linear map and a softplus scale with a floor."""

    def __init__(self, in_dim: int, dim: int):
        super().__init__()
        self.linear = torch.nn.Linear(in_dim, 2 * dim)

    def forward(self, x):
        loc, raw = self.linear(x).chunk(2, dim=-1)
        return loc, torch.nn.functional.softplus(raw) + 0.05


def float64_bank_loss(*args, **kwargs):
    """An ``rpm.losses.NTXentLoss(*args, **kwargs)`` built under float64 as the default dtype:
    its memory bank's starting rows are drawn in float64, unit to float64's precision, as the
    float64 loops that check it take them."""
    from rpm.losses import NTXentLoss

    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        return NTXentLoss(*args, **kwargs)
    finally:
        torch.set_default_dtype(before)
