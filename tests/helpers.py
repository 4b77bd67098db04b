"""Small networks shared by the tests."""

import torch


class GaussianHead(torch.nn.Module):
    """x -> (loc, scale): a linear map and a softplus scale with a floor."""

    def __init__(self, in_dim: int, dim: int):
        super().__init__()
        self.linear = torch.nn.Linear(in_dim, 2 * dim)

    def forward(self, x):
        loc, raw = self.linear(x).chunk(2, dim=-1)
        return loc, torch.nn.functional.softplus(raw) + 0.05
