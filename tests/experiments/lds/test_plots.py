"""``rpm.experiments.lds.plots``: the titles and axis labels of ``dynamics.png`` lie inside the
figure, as matplotlib's renderer lays them out (a one-line title wider than its axes was
clipped: constrained layout makes room for a title's height, not its width)."""

import pytest
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg

from rpm.experiments.figures import DPI
from rpm.experiments.lds.plots import plot_dynamics


@pytest.mark.parametrize("dim", [1, 3, 10])
def test_dynamics_titles_and_labels_lie_inside_the_figure(tmp_path, dim):
    torch.manual_seed(0)
    learned = torch.complex(torch.randn(dim), torch.randn(dim)) * 0.5
    true = torch.complex(torch.randn(dim), torch.randn(dim)) * 0.5
    states, decoded = torch.randn(100, dim), torch.randn(100, dim)
    fig = plot_dynamics(tmp_path / "dynamics.png", learned, true, states, decoded,
                        {"r2": 0.98765, "eigenvalue_error": 0.0123})
    assert (tmp_path / "dynamics.png").stat().st_size > 0
    FigureCanvasAgg(fig)
    fig.set_dpi(DPI)  # as savefig draws it
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    titles = [ax.title for ax in fig.axes]
    assert all(title.get_text() for title in titles)
    texts = titles + [label for ax in fig.axes for label in (ax.xaxis.label, ax.yaxis.label)
                      if label.get_text()]
    for text in texts:
        box = text.get_window_extent(renderer)
        assert (box.x0 >= fig.bbox.x0 - 0.5 and box.x1 <= fig.bbox.x1 + 0.5
                and box.y0 >= fig.bbox.y0 - 0.5 and box.y1 <= fig.bbox.y1 + 0.5), (
            text.get_text(), box, fig.bbox)
