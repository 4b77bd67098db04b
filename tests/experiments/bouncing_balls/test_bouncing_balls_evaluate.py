"""The bouncing-balls evaluation: the linear decoder's R^2, pixel error and decoded positions
against an independent numpy least-squares computation written from the definitions."""

import numpy as np
import pytest
import torch

from rpm.data.bouncing_balls import generate_bouncing_balls
from rpm.experiments.bouncing_balls.evaluate import encode, evaluate, fit_linear_decoder
from rpm.experiments.center_of_mass import CenterOfMass


class _DistortedCentres(torch.nn.Module):
    """A stand-in encoder: the frames' centres of mass through a fixed nonlinear map, so that
    the affine decoder is good but not exact."""

    def __init__(self) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.mix = torch.randn(6, 6, generator=generator, dtype=torch.float64)
        self.com = CenterOfMass(eps=0.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.com(x.double()) / 8.0 - 1.0) @ self.mix


def test_evaluate_matches_numpy_least_squares_and_the_definitions():
    video = generate_bouncing_balls(num_frames=80, image_size=12, ball_diameter=3.0, seed=4)
    encoder = _DistortedCentres()
    scores = evaluate(encoder, video.frames, video.centres, num_train=60)
    z = encoder(video.frames).numpy()  # (T, 6)
    design = np.hstack([z, np.ones((80, 1))])
    target = video.centres.reshape(80, 6).double().numpy()
    coef = np.linalg.lstsq(design[:60], target[:60], rcond=None)[0]
    prediction = design @ coef
    r2, train_r2 = [], []
    for d in range(6):
        for scores_list, rows in ((r2, slice(60, 80)), (train_r2, slice(0, 60))):
            truth, guess = target[rows, d], prediction[rows, d]
            scores_list.append(1 - np.sum((truth - guess) ** 2)
                               / np.sum((truth - truth.mean()) ** 2))
    distances = [
        np.hypot(*(prediction[t, 2 * k:2 * k + 2] - target[t, 2 * k:2 * k + 2]))
        for t in range(60, 80) for k in range(3)
    ]  # fmt: skip
    np.testing.assert_allclose(scores.r2_per_coordinate, r2, rtol=1e-7)
    assert scores.r2 == pytest.approx(np.mean(r2), rel=1e-7)
    assert scores.train_r2 == pytest.approx(np.mean(train_r2), rel=1e-7)
    assert scores.pixel_error == pytest.approx(np.mean(distances), rel=1e-7)
    np.testing.assert_allclose(scores.decoded.reshape(20, 6), prediction[60:], rtol=1e-7)
    assert 0.5 < scores.r2 < 0.999  # the distortion is visible but mild


def test_true_centres_of_mass_decode_perfectly_and_the_decoder_is_affine():
    video = generate_bouncing_balls(num_frames=50, image_size=16, ball_diameter=3.0, seed=1)
    scores = evaluate(CenterOfMass(eps=0.0), video.frames, video.centres, num_train=30)
    # rendering discretisation moves the centre of mass by < 0.06 px
    assert scores.r2 > 0.999 and scores.pixel_error < 0.06
    features = torch.randn(40, 3, dtype=torch.float64)
    coef = torch.tensor([[1.0, 2.0], [0.0, -1.0], [3.0, 0.5], [4.0, -2.0]], dtype=torch.float64)
    targets = torch.cat([features, torch.ones(40, 1, dtype=torch.float64)], 1) @ coef
    torch.testing.assert_close(fit_linear_decoder(features, targets), coef)


def test_encode_uses_the_running_statistics_in_chunks():
    encoder = torch.nn.Sequential(torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2))
    encoder.train()
    x = torch.randn(10, 4)
    z = encode(encoder, x, chunk=3)  # chunks of 3, 3, 3, 1: batch statistics would fail on 1
    assert not encoder.training and z.dtype == torch.float64 and z.shape == (10, 2)
    torch.testing.assert_close(z, encoder(x).double())
