"""The learning curve's layout: fixed margins (no tight_layout, which draws the figure a second
time) that still keep every label inside the figure, for long titles and wide tick labels."""

import os

import pytest

from jrl.experiment import plots


def _run_dir(tmp_path, evaluations, rows):
  os.makedirs(tmp_path / "metrics")
  with open(tmp_path / "metrics" / "evaluator.csv", "w") as f:
    f.write("actor_steps,eval_return\n" + "".join(f"{s},{r}\n" for s, r in evaluations))
  with open(tmp_path / "metrics" / "actor.csv", "w") as f:
    f.write("actor_steps,episode_return,host\n" + "".join(f"{s},{r},here\n" for s, r in rows))
  return str(tmp_path)


@pytest.mark.parametrize("title, returns, threshold", [
    ("dqn on CartPole-v1, seed 0", [10.0, 200.0, 500.0], 475.0),
    ("ppo on gymnax:CartPole-v1, seed 3 (learning_rate=0.001, entropy_cost=0.01, clip_epsilon=0.2) "
     "(device, 16 runs vmapped)", [10.0, 200.0, 500.0], 475.0),
    ("sac on Pendulum-v1, seed 0", [-1500.0, -800.0, -150.0], -20000.0),
    ("a small return", [0.01, 0.25, 0.5], None),
])
def test_every_label_lies_inside_the_figure(tmp_path, title, returns, threshold):
  run_dir = _run_dir(tmp_path, [(1000 * (i + 1), r) for i, r in enumerate(returns)],
                     [(500 * (i + 1), r) for i, r in enumerate(returns * 2)])
  fig = plots.learning_curve_figure(run_dir, title, threshold)
  renderer = fig.canvas.get_renderer()
  fig.draw(renderer)
  ax = fig.axes[0]
  drawn = lambda axis, limits: [tick.label1 for tick in axis.get_major_ticks()
                                 if min(limits) <= tick.get_loc() <= max(limits)]  # the others are not drawn
  texts = [ax.title, ax.yaxis.label, ax.xaxis.label, *drawn(ax.yaxis, ax.get_ylim()), *drawn(ax.xaxis, ax.get_xlim())]
  width, height = fig.bbox.width, fig.bbox.height
  for text in texts:
    if not text.get_visible() or not text.get_text():
      continue
    box = text.get_window_extent(renderer)
    assert box.x0 >= 0 and box.y0 >= 0 and box.x1 <= width and box.y1 <= height, (text.get_text(), box)
  assert ("\n" in ax.get_title()) == (len(title) > plots.TITLE_CHARACTERS)


def test_the_png_is_written_where_the_run_keeps_its_plots(tmp_path):
  run_dir = _run_dir(tmp_path, [(1000, 1.0), (2000, 3.0)], [(500, 0.5)])
  path = plots.plot_learning_curve(run_dir, "t", None)
  assert path == os.path.join(run_dir, "plots", "learning_curve.png")
  with open(path, "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("curves, cores, workers", [
    (16, 2, 2),     # a 2-core box: 8 curves each
    (16, 16, 2),    # 8 curves each, not 1: a process's start costs about 8 curves
    (15, 16, 0),    # one worker's worth: drawn here
    (256, 16, 16),  # a grid: one a core (this process waits)
    (256, 1, 0),
    (1, 64, 0),
])
def test_a_pool_draws_only_what_repays_its_start(curves, cores, workers):
  assert plots.plot_workers(curves, cores) == workers


def test_curves_drawn_by_a_pool_of_processes_are_the_same_pngs(tmp_path):
  """Real spawned processes (2 workers, forced on any machine) write the bytes this process writes."""
  curves = []
  for k in range(5):
    run_dir = _run_dir(tmp_path / f"run{k}", [(1000 * (i + 1), 10.0 * i * (k + 1)) for i in range(4)],
                       [(500 * (i + 1), 5.0 * i + k) for i in range(8)])
    curves.append(plots.Curve(run_dir, f"run {k}", 30.0 if k % 2 else None))
  drawn = plots.plot_learning_curves(curves, workers=2)
  assert drawn == [os.path.join(c.run_dir, "plots", "learning_curve.png") for c in curves]
  pooled = []
  for path in drawn:
    with open(path, "rb") as f:
      pooled.append(f.read())
    os.remove(path)
  assert plots.plot_learning_curves(curves, workers=0) == drawn
  for path, data in zip(drawn, pooled):
    with open(path, "rb") as f:
      assert f.read() == data
  assert len(set(pooled)) == 5  # five different curves, not one drawn five times


def test_a_worker_that_fails_fails_the_drawing(tmp_path):
  """A run folder whose plots/ is a file: its worker's error reaches the caller as one error."""
  good = _run_dir(tmp_path / "good", [(1000, 1.0)], [(500, 0.5)])
  bad = _run_dir(tmp_path / "bad", [(1000, 1.0)], [(500, 0.5)])
  (tmp_path / "bad" / "plots").write_text("not a folder\n")
  with pytest.raises(RuntimeError, match="drawing learning curves failed"):
    plots.plot_learning_curves([plots.Curve(good, "g", None), plots.Curve(bad, "b", None)], workers=2)
