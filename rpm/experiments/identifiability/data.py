r"""Data of the ``rpm identifiability`` experiment: observed pairs
:math:`(x, x') = (g(z), g(z'))` with :math:`z \sim p(z)`, :math:`z' \sim p(z' \mid z)`
(Zimmermann et al., 2021), drawn on the training device.

:class:`PairStream` makes the minibatch of step :math:`s` a pure function of ``(seed, s)``: the
pairs of ``chunk_steps`` consecutive steps are drawn at once from a generator seeded by
``(seed, s // chunk_steps)`` alone. This has two purposes:

* speed: the samplers run on the device, and the one host synchronisation of a rejection
  sampler (vMF) happens once per chunk instead of once per step;
* exact resumption: a run restarted at any step draws the same minibatches as an uninterrupted
  one, without any sampler state in the checkpoint.

:func:`~rpm.experiments.common.derived_seed` gives independent seeds for the mixing function,
the training stream and the held-out sets of one run seed (``numpy.random.SeedSequence``).
"""

from __future__ import annotations

import torch

from rpm._validation import check_int, check_positive_int
from rpm.data.synthetic import InvertibleMLP, LatentProcess
from rpm.experiments.common import derived_seed

__all__ = ["ArrayPairStream", "PairStream", "held_out_set"]

def _generator(device: torch.device, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


@torch.no_grad()
def held_out_set(process: LatentProcess, mixing: InvertibleMLP, num_samples: int, seed: int
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Fresh latents :math:`z_i \sim p(z)` and observations :math:`x_i = g(z_i)` for evaluation.

    :param LatentProcess process: the latent process (sets device and dtype).
    :param InvertibleMLP mixing: the mixing g, on the process's device.
    :param int num_samples: number of samples M.
    :param int seed: seed of the generator (e.g. ``derived_seed(seed, "eval")``).
    :return: ``(z, x)``. Shape: (M, n) each.
    """
    z = process.sample_marginal(num_samples, _generator(process.device, seed))
    return z, mixing(z)


class PairStream:
    r"""Minibatches of observed positive pairs :math:`(x_i, x'_i) = (g(z_i), g(z'_i))`.

    ``stream(step)`` returns the minibatch of training step ``step``, a pure function of
    ``(seed, step)`` (module docstring). The latest chunk of ``chunk_steps`` minibatches,
    ``2 * chunk_steps * batch_size * n`` numbers, is kept on the device.

    :param LatentProcess process: :math:`p(z)` and :math:`p(z' \mid z)`.
    :param InvertibleMLP mixing: the mixing g, on the process's device.
    :param int batch_size: pairs per minibatch N.
    :param int seed: the run seed.
    :param int chunk_steps: minibatches drawn at once (>= 1).
    """

    def __init__(self, process: LatentProcess, mixing: InvertibleMLP, batch_size: int, seed: int,
                 chunk_steps: int = 16) -> None:
        batch_size = check_positive_int("batch_size", batch_size)
        chunk_steps = check_positive_int("chunk_steps", chunk_steps)
        self.process = process
        self.mixing = mixing
        self.batch_size = batch_size
        self.seed = seed
        self.chunk_steps = chunk_steps
        self._chunk_index: int | None = None
        self._chunk: tuple[torch.Tensor, torch.Tensor] | None = None

    @torch.no_grad()
    def _draw_chunk(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        generator = _generator(self.process.device, derived_seed(self.seed, "train", index))
        z, z2 = self.process.sample_pairs(self.chunk_steps * self.batch_size, generator)
        shape = (self.chunk_steps, self.batch_size, -1)
        return self.mixing(z).reshape(shape), self.mixing(z2).reshape(shape)  # (C, N, n) each

    def latents(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        r"""The latent pairs :math:`(z, z')` of ``step`` (recomputed; for tests and plots).

        :return: Shape: (N, n) each.
        """
        index, position = divmod(step, self.chunk_steps)
        generator = _generator(self.process.device, derived_seed(self.seed, "train", index))
        z, z2 = self.process.sample_pairs(self.chunk_steps * self.batch_size, generator)
        rows = slice(position * self.batch_size, (position + 1) * self.batch_size)
        return z[rows], z2[rows]

    def __call__(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The observed pairs ``(x, x2)`` of training step ``step`` (>= 0). Shape: (N, n) each."""
        step = check_int("step", step, minimum=0)
        index, position = divmod(step, self.chunk_steps)
        if index != self._chunk_index:
            self._chunk = self._draw_chunk(index)
            self._chunk_index = index
        x, x2 = self._chunk
        return x[position], x2[position]


class ArrayPairStream:
    r"""Minibatches of given positive pairs (``rpm identifiability --data``): step ``step``
    takes ``batch_size`` distinct pairs, uniformly, from a CPU generator seeded by
    ``derived_seed(seed, "train", step)`` alone (so a resumed run draws the same minibatches).

    :param torch.Tensor views: the training pairs, on the training device. Shape: (M, 2, P).
    :param int batch_size: pairs per minibatch, at most M.
    :param int seed: the run seed.
    """

    def __init__(self, views: torch.Tensor, batch_size: int, seed: int) -> None:
        if views.dim() != 3 or views.shape[1] != 2:
            raise ValueError(f"views must have shape (M, 2, P), got {tuple(views.shape)}")
        self.batch_size = check_int("batch_size", batch_size, minimum=1, maximum=len(views))
        self.views = views
        self.seed = seed

    def __call__(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The observed pairs ``(x, x2)`` of training step ``step`` (>= 0). Shape: (N, P) each."""
        step = check_int("step", step, minimum=0)
        generator = torch.Generator().manual_seed(derived_seed(self.seed, "train", step))
        rows = torch.randperm(len(self.views), generator=generator)[:self.batch_size]
        pairs = self.views[rows.to(self.views.device)]  # (N, 2, P)
        return pairs[:, 0], pairs[:, 1]
