"""The experiments' figures show what their captions say: one colour per run across panels, the
untrained baseline in both panels of the bouncing-balls comparison, error bars over seeds equal to
the standard deviation of the inputs, value labels clear of the baseline, legends and counts in
the titles, an R^2 axis zoomed on the data, round ticks on the log axis, and 150 dpi."""

import matplotlib.image
import numpy as np
import pytest
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_rgba
from matplotlib.container import BarContainer

from rpm.experiments.bouncing_balls.plots import (
    plot_comparison,
    plot_feature_maps,
    plot_training_curves,
    plot_trajectories,
)
from rpm.experiments.figures import DPI, colours_for, plot_training
from rpm.experiments.identifiability import plots as identifiability_plots


def _result(r2, error, untrained_r2=0.6, untrained_error=3.0):
    return {"r2": r2, "pixel_error": error, "untrained_r2": untrained_r2,
            "untrained_pixel_error": untrained_error}


def _bar_colours(ax):
    return [patch.get_facecolor() for patch in ax.patches]


def test_colours_are_fixed_per_name_and_distinct():
    first = colours_for(["rbf", "bilinear", "cosine", "dynamics"])
    second = colours_for(["dynamics", "state-space", "rbf", "another"])
    assert first["rbf"] == second["rbf"] and first["dynamics"] == second["dynamics"]
    assert len(set(second.values())) == 4  # the new names take colours nobody else has
    assert len(set(first.values())) == 4


def _assert_labels_clear(fig, ax, tops, lines):
    """Each value label sits above its bar's top, and the untrained line does not cross it."""
    labels = list(ax.texts)
    assert len(labels) == len(tops)
    renderer = FigureCanvasAgg(fig).get_renderer()
    for text, top, line in zip(labels, tops, lines, strict=True):
        box = text.get_window_extent(renderer)
        x = text.get_position()[0]
        assert box.y0 > ax.transData.transform((x, top))[1]
        line_y = ax.transData.transform((x, line))[1]
        assert not box.y0 - 1 <= line_y <= box.y1 + 1


def test_bouncing_comparison_colours_baseline_labels_and_dpi(tmp_path):
    results = {"rbf": _result(0.985, 0.9), "bilinear": _result(0.62, 2.9),
               "dynamics": _result(0.99, 0.7)}  # bilinear just above / below the baseline
    path = tmp_path / "comparison.png"
    fig = plot_comparison(path, results)
    left, right = fig.axes[:2]
    expected = [to_rgba(colour) for colour in colours_for(list(results)).values()]
    assert _bar_colours(left) == expected and _bar_colours(right) == expected
    for ax, key in ((left, "untrained_r2"), (right, "untrained_pixel_error")):
        baselines = [segment[0][1] for collection in ax.collections
                     for segment in collection.get_segments()]
        assert baselines == pytest.approx([result[key] for result in results.values()])
        values = [result["r2" if ax is left else "pixel_error"] for result in results.values()]
        _assert_labels_clear(fig, ax, values, [result[key] for result in results.values()])
    height, width = matplotlib.image.imread(path).shape[:2]
    assert (width, height) == (round(fig.get_figwidth() * DPI), round(fig.get_figheight() * DPI))


def test_bouncing_comparison_error_bars_are_the_seed_std(tmp_path):
    untrained = (0.55, 0.6, 0.8)  # one initial encoder per seed, shared by the priors
    untrained_error = (2.0, 3.0, 4.0)
    errors = {"rbf": (1.0, 0.8, 1.1), "bilinear": (2.5, 2.7, 2.9)}  # bilinear: just under 3.0
    r2s = {"rbf": (0.98, 0.99, 0.97), "bilinear": (0.5, 0.7, 0.9)}
    seeds = {name: [_result(r2s[name][i], errors[name][i], untrained[i], untrained_error[i])
                    for i in range(3)] for name in r2s}
    fig = plot_comparison(tmp_path / "comparison.png", seeds)
    left = fig.axes[0]
    (container,) = [c for c in left.containers if isinstance(c, BarContainer)]
    bars = [patch.get_height() for patch in container]
    assert bars == pytest.approx([np.mean([r["r2"] for r in runs]) for runs in seeds.values()])
    # the error bar of each bar spans mean +- std (ddof=1) over the seeds
    spans = [segment[:, 1] for container in left.containers if hasattr(container, "lines")
             and container.lines[2] for segment in container.lines[2][0].get_segments()]
    expected = [np.std([r["r2"] for r in runs], ddof=1) for runs in seeds.values()]
    assert [abs(span[1] - span[0]) / 2 for span in spans] == pytest.approx(expected)
    assert "3 seeds" in fig._suptitle.get_text()
    # the untrained encoder's spread over seeds is one band: mean +- std of the untrained R^2
    (band,) = [patch for patch in left.patches if patch not in container.patches]
    low, high = band.get_bbox().y0, band.get_bbox().y1
    mean, std = np.mean(untrained), np.std(untrained, ddof=1)
    assert (low, high) == pytest.approx((mean - std, mean + std))
    # labels clear of the untrained line, with the bars' error bars on top of the bars
    right = fig.axes[1]
    tops = [np.mean(errors[name]) + np.std(errors[name], ddof=1) for name in seeds]
    _assert_labels_clear(fig, right, tops, [np.mean(untrained_error)] * len(seeds))


def test_bouncing_trajectories_legend_and_frame_count(tmp_path):
    centres = torch.rand(200, 3, 2) * 32
    fig = plot_trajectories(tmp_path / "trajectories.png", centres,
                            {"rbf": centres + 0.1, "bilinear": centres - 0.1}, num_frames=60)
    legend = [text.get_text() for text in fig.legends[0].get_texts()]
    assert legend == ["ball 1", "ball 2", "ball 3", "true", "decoded"]
    assert "first 60 of the 200 held-out frames" in fig._suptitle.get_text()


def test_bouncing_feature_maps_grid_has_a_colour_bar_and_explains_the_marker(tmp_path):
    frames = torch.rand(4, 3, 16, 16)
    maps = {"rbf": torch.rand(4, 3, 16, 16), "dynamics": torch.rand(4, 3, 16, 16)}
    com = {name: torch.rand(4, 6) * 16 for name in maps}
    fig = plot_feature_maps(tmp_path / "maps.png", frames, maps, com, max_frames=2)
    images = [ax for ax in fig.axes if ax.images]
    assert len(images) == 2 * 2 * (1 + 3)  # priors x frames x (frame + maps)
    assert any(ax.get_label() == "<colorbar>" for ax in fig.axes)
    assert any("shrunk copy" in text.get_text() for text in fig.texts)


def test_training_figure_one_column_per_run(tmp_path):
    histories = {
        "rbf": {"losses": [[10, 1.0], [20, 0.5], [30, 0.4]],
                "evaluations": [{"step": 15, "r2": 0.7}, {"step": 30, "r2": 0.95}]},
        "dynamics": {"losses": [[10, 3.0], [20, 2.0]], "evaluations": [{"step": 20, "r2": 0.9}]},
    }
    fig = plot_training_curves(tmp_path / "training.png", histories)
    assert len(fig.axes) == 4
    score_axes = fig.axes[2:]
    for ax, history in zip(score_axes, histories.values(), strict=True):
        (line,) = ax.lines
        assert list(line.get_xdata()) == [e["step"] for e in history["evaluations"]]
        assert line.get_marker() == "o"
    with pytest.raises(ValueError, match="at least one"):
        plot_training(tmp_path / "empty.png", {})


def test_training_figure_wraps_many_runs_into_bands(tmp_path):
    """Seven runs: two bands of at most RUNS_PER_BAND columns, each run's loss above its own
    score, the last band's three empty places hidden, one score axis for all."""
    from rpm.experiments.figures import RUNS_PER_BAND

    histories = {f"run{k}": {"losses": [[10, 2.0 + k], [20, 1.0 + k]],
                             "evaluations": [{"step": 20, "r2": 0.1 * k}]} for k in range(7)}
    fig = plot_training(tmp_path / "training.png", histories, title="seven runs")
    assert RUNS_PER_BAND == 5
    visible = [ax for ax in fig.axes if ax.get_visible()]
    assert len(fig.axes) == 4 * RUNS_PER_BAND and len(visible) == 14
    tops = [ax for ax in visible if ax.get_title()]
    assert [ax.get_title() for ax in tops] == list(histories)
    for k, top in enumerate(tops):
        (loss_line,) = top.lines
        assert list(loss_line.get_ydata()) == [2.0 + k, 1.0 + k]
        row, column = divmod(k, RUNS_PER_BAND)
        spec = top.get_subplotspec()
        assert (spec.rowspan.start, spec.colspan.start) == (2 * row, column)
    bottoms = [ax for ax in visible if not ax.get_title()]
    assert [ax.lines[0].get_ydata()[0] for ax in bottoms] == pytest.approx([0.1 * k for k in range(7)])
    assert len({ax.get_ylim() for ax in bottoms}) == 1


def _identifiability_run(r2, mcc, dim=4, concentrations=None):
    steps = [0, 100, 200]
    return {
        "trajectory": {"step": steps, "r2": r2, "mcc": mcc, "wall_time": [0.0, 1.0, 2.0]},
        "baseline": {"identity": {"r2": 0.66}},
        "losses": [[50, 1.0], [100, 0.8], [150, 0.7], [200, 0.65]],
        "r2_per_dimension": list(np.linspace(0.93, 0.99, dim)),
        **({"concentration_matched": concentrations,
            "concentration_oracle": [4.0, 4.0, 17.0, 17.0]} if concentrations else {}),
    }


def test_identifiability_scores_one_panel_with_markers_and_both_baselines(tmp_path):
    runs = {"cosine": _identifiability_run([0.7, 0.8, 0.9], [0.6, 0.7, 0.8])}
    runs["cosine"]["baseline"]["identity"]["mcc"] = 0.61
    fig = identifiability_plots.plot_scores(tmp_path / "scores.png", runs)
    (ax,) = fig.axes
    data_lines = [line for line in ax.lines if len(line.get_xdata()) == 3]
    assert len(data_lines) == 2 and all(line.get_marker() not in (None, "None", "")
                                        for line in data_lines)
    assert ax.get_xlabel() == "training step"
    baselines = {line.get_label(): line.get_ydata()[0] for line in ax.lines
                 if line.get_label().startswith("identity")}
    assert baselines == {"identity map: $R^2$": 0.66, "identity map: MCC": 0.61}


def test_training_title_is_centred_over_the_panels(tmp_path):
    runs = {"cosine": _identifiability_run([0.7, 0.8, 0.9], [0.6, 0.7, 0.8])}
    fig = identifiability_plots.plot_training_curves(tmp_path / "training.png", runs)
    boxes = [ax.get_position() for ax in fig.axes]
    centre = (min(b.x0 for b in boxes) + max(b.x1 for b in boxes)) / 2
    assert fig._suptitle.get_position()[0] == pytest.approx(centre, abs=0.02)
    assert abs(centre - 0.5) > 0.02  # the labels on the left: the figure's centre is not it


def test_identifiability_comparison_zooms_r2_and_has_round_log_ticks(tmp_path):
    runs = {"cosine": _identifiability_run([0.7, 0.8, 0.9], [0.6, 0.7, 0.8]),
            "anisotropic": _identifiability_run([0.7, 0.9, 0.99], [0.6, 0.9, 0.98],
                                                concentrations=[3.0, 3.5, 14.0, 15.0])}
    fig = identifiability_plots.plot_comparison(tmp_path / "comparison.png", runs,
                                                [5.0, 5.0, 25.0, 25.0])
    left, right = fig.axes
    assert left.get_ylim()[0] > 0.8  # the axis shows the differences between 0.93 and 0.99
    assert left.get_xlabel() == right.get_xlabel() == "true latent dimension"
    ticks = right.get_yticks()
    assert set(ticks) <= {1.0, 2.0, 5.0, 10.0, 20.0, 50.0} and len(ticks) >= 2
    assert [label.get_text() for label in right.get_yticklabels()] != [""] * len(ticks)
    assert right.yaxis.get_minor_locator().tick_values(1, 50) == []


def test_forecast_figure_has_a_legend_and_the_results_errors(tmp_path):
    from rpm.experiments.bouncing_balls.plots import plot_forecasts

    rng = np.random.default_rng(0)
    centres = torch.tensor(rng.uniform(0, 32, (40, 3, 2)))
    forecast = centres + torch.tensor(rng.normal(0, 1, (40, 3, 2)))
    fig = plot_forecasts(tmp_path / "forecast.png", centres, forecast)
    (ax,) = fig.axes
    labels = [text.get_text() for text in fig.legends[0].get_texts()]
    assert labels == ["ball 1", "ball 2", "ball 3", "true path", "forecast", "forecast error"]
    every = (forecast - centres).norm(dim=-1).mean().item()  # over all 40 frames, not the 15
    assert "the first 15 of 40 held-out frames" in ax.get_title()
    assert f"mean error over all 40: {every:.2f} px" in ax.get_title()
    fig = plot_forecasts(tmp_path / "forecast.png", centres, forecast, error_px=3.58,
                         baseline_px=4.9)
    assert "3.58 px (last position as the forecast: 4.90 px)" in fig.axes[0].get_title()


def test_comparison_untrained_line_is_dashed_so_a_bar_top_below_it_shows(tmp_path):
    results = {name: {"r2": r2, "pixel_error": 3.0, "untrained_r2": 0.638,
                      "untrained_pixel_error": 4.0}
               for name, r2 in (("rbf", 0.985), ("bilinear", 0.598))}
    fig = plot_comparison(tmp_path / "comparison.png", results)
    lines = [c for c in fig.axes[0].collections if c.get_segments()
             and len(c.get_segments()[0]) == 2]
    assert lines and all(c.get_linestyle()[0][1] is not None for c in lines)  # dashed
