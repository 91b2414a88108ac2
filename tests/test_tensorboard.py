"""TensorBoard event files (jrl.experiment.logging.TensorBoard): what TensorBoard itself reads
back from them, with its own reader."""

from jrl.experiment.logging import MetricsLogger, TensorBoard, last_step


def _scalars(folder):
  from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
  events = EventAccumulator(str(folder))  # purges orphaned points, as the TensorBoard server does
  events.Reload()
  return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_a_node_that_continues_has_tensorboard_drop_its_predecessors_later_points(tmp_path):
  first = MetricsLogger(str(tmp_path), "actor0", TensorBoard(str(tmp_path), subdir="actor0", flush_each=True))
  for step in (100, 200, 300, 400):
    first.write({"actor_steps": step, "episode_return": float(step)})
  first.close()
  path = tmp_path / "metrics" / "actor0.csv"
  # The resumed run cut the CSV back to its checkpoint at step 200; the node continues from there.
  lines = path.read_text().splitlines()
  path.write_text("\n".join(lines[:3]) + "\n")
  assert last_step(str(path), "actor_steps") == 200
  tb = TensorBoard(str(tmp_path), subdir="actor0", continue_after=200, flush_each=True)
  # Gone as soon as the node starts, before its first row (its points could come much later).
  assert _scalars(tmp_path / "tensorboard" / "actor0") == {"actor0/episode_return": [(100, 100.0), (200, 200.0)]}
  second = MetricsLogger(str(tmp_path), "actor0", tb, resume_from=path.stat().st_size)
  second.write({"actor_steps": 250, "episode_return": -1.0})
  # Each point once, in order: 300 and 400 of the killed session are gone, as from the CSV.
  assert _scalars(tmp_path / "tensorboard" / "actor0") == {
      "actor0/episode_return": [(100, 100.0), (200, 200.0), (250, -1.0)]}
  assert [row.split(",")[0] for row in path.read_text().splitlines()] == ["actor_steps", "100", "200", "250"]


def test_last_step_of_a_missing_or_empty_file_is_none(tmp_path):
  assert last_step(str(tmp_path / "none.csv"), "actor_steps") is None
  (tmp_path / "empty.csv").write_text("actor_steps,x\n")
  assert last_step(str(tmp_path / "empty.csv"), "actor_steps") is None
