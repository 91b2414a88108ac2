"""The README's commands, run as typed from the repository root, with small budgets (slow tier).

The commands are those of the README's ```bash blocks (one a line, `# comments` dropped) and the
commands of its workflows table (a cell that is one code span starting with `make ` or
`.venv/bin/`). Each is either run or skipped by design, and the two lists below must name every
one of them, so a command added to the README is run here or given a reason.

What a run changes in a command, and nothing else:
- its budget: the `BUDGETS` replacements (fewer env steps, two seeds instead of five);
- its folders: `runs/` becomes a temporary folder's `runs/`, so nothing is left under the
  repository's `runs/` and no one else's run is touched. Commands that write the default run
  folder, `runs/<agent>-<env>-s<seed>-<time>/` (`make train`, `launch.train` without `--run_dir`),
  write it in the repository: the test finds the one folder that appeared in `runs/` during the
  command with the command's budget in its config.json (the budgets are odd step counts that
  no other test uses), and removes it; other people's runs that appear meanwhile are left alone.

All of them run the full stack's `.venv` (make setup): `needs_reverb`.
"""

import json
import os
import pathlib
import re
import shutil
import subprocess
import time

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.needs_reverb]

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = ROOT / "README.md"

# command as typed -> (old, new) replacements that shrink its budget.
BUDGETS = {
    "make train": [("make train", "make train STEPS=3100")],
    "make train AGENT=ppo STEPS=100000": [("STEPS=100000", "STEPS=3200")],
    ".venv/bin/python -m launch.train --agent dqn --distributed --num_actors 4 --inference server --steps 100000":
        [("--steps 100000", "--steps 3300")],
    ".venv/bin/python -m launch.train --backend device --agent ppo --env gymnax:CartPole-v1 --steps 100000":
        [("--steps 100000", "--steps 5100")],
    ".venv/bin/python -m examples.own_loop --steps 50000": [("--steps 50000", "--steps 2500")],
    ".venv/bin/python -m launch.sweep --agent dqn --seeds 0-4 --run_dir runs/sweep-dqn --deterministic":
        [("--seeds 0-4", "--seeds 0-1"), ("--deterministic", "--deterministic --steps 2000")],
    ".venv/bin/python -m launch.train --agent dqn --env CartPole-v1 --steps 50000 --run_dir runs/dqn-s0":
        [("--steps 50000", "--steps 3000")],
    ".venv/bin/python -m launch.evaluate runs/dqn-s0": [],
    ".venv/bin/python -m launch.train --resume runs/dqn-s0 --steps 100000": [("--steps 100000", "--steps 4000")],
    "make docs": [],
}

# command as typed -> why it is not run here.
SKIPPED = {
    "make test": "the test suite itself (make test / make test-all run this file)",
    ".venv/bin/python -m launch.train --agent dqn --distributed --num_actors 8 --launcher slurm "
    "--hosts node1,node2,node3": "needs a Slurm cluster; tests/test_multihost.py runs the same launcher on a "
                                 "three-host test cluster (scripts/slurm_test_cluster.sh)",
    ".venv/bin/tensorboard --logdir runs": "a server that runs until stopped; the test checks that "
                                           ".venv/bin/tensorboard exists",
}

# command as typed -> what a successful run leaves (paths under the temporary folder) or prints.
EXPECT = {
    ".venv/bin/python -m launch.sweep --agent dqn --seeds 0-4 --run_dir runs/sweep-dqn --deterministic":
        ["runs/sweep-dqn/sweep.json", "runs/sweep-dqn/report.md"],
    ".venv/bin/python -m launch.train --agent dqn --env CartPole-v1 --steps 50000 --run_dir runs/dqn-s0":
        ["runs/dqn-s0/summary.json", "runs/dqn-s0/policies/best.msgpack"],
    ".venv/bin/python -m launch.train --agent dqn --distributed --num_actors 4 --inference server --steps 100000":
        ["done:"],
    ".venv/bin/python -m launch.evaluate runs/dqn-s0": ["±"],
}


def readme_commands():
  text = README.read_text()
  commands = []
  for block in re.findall(r"```bash\n(.*?)```", text, re.DOTALL):
    for line in block.replace("\\\n", " ").splitlines():
      command = re.split(r"\s+#", line, maxsplit=1)[0].strip()
      if command:
        commands.append(command)
  for row in re.findall(r"^\|(.*)\|$", text, re.MULTILINE):
    for cell in row.split("|"):
      match = re.fullmatch(r"\s*`((?:make |\.venv/bin/)[^`]*)`\s*", cell)
      if match:
        commands.append(match.group(1))
  return commands


COMMANDS = readme_commands()


def test_every_readme_command_is_run_or_skipped_with_a_reason():
  assert COMMANDS, "no commands found in README.md"
  unlisted = [c for c in COMMANDS if c not in BUDGETS and c not in SKIPPED]
  assert not unlisted, f"README commands this test neither runs nor skips: {unlisted}"
  stale = [c for c in list(BUDGETS) + list(SKIPPED) if c not in COMMANDS]
  assert not stale, f"listed here but no longer in README.md: {stale}"


def test_skipped_by_design_tensorboard_is_the_venvs():
  assert (ROOT / ".venv" / "bin" / "tensorboard").is_file()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
  """A temporary folder whose `runs/` stands for the repository's."""
  return tmp_path_factory.mktemp("readme")


def as_run(command: str, workdir: pathlib.Path) -> str:
  for old, new in BUDGETS[command]:
    assert old in command, (command, old)
    command = command.replace(old, new, 1)
  return re.sub(r"(?<![\w./-])runs/", f"{workdir}/runs/", command)


def _runs_entries():
  runs = ROOT / "runs"
  return set(os.listdir(runs)) if runs.is_dir() else set()


def _budget_steps(command: str) -> int:
  return int(re.search(r"(?:STEPS=|--steps )(\d+)", command).group(1))


def _writes_default_run_dir(command: str) -> bool:
  return command.startswith("make train") or (
      "-m launch.train" in command and "--run_dir" not in command and "--resume" not in command)


def _check_and_remove_our_run_dir(before, to_run: str, result) -> None:
  """The run folder the command made under the repository's runs/ (see the docstring): a finished
  run (its summary, and its final checkpoint: the relative run directories of `make train` once
  crashed there), named on the command's last line; then removed."""
  made = sorted(_runs_entries() - before)
  ours = [name for name in made if (ROOT / "runs" / name / "config.json").is_file()
          and json.loads((ROOT / "runs" / name / "config.json").read_text())["experiment"]["steps"]
          == _budget_steps(to_run)]
  stdout = result.stdout
  try:
    assert result.returncode == 0, (result.stdout + result.stderr)[-5000:]
    assert len(ours) == 1, (made, stdout[-3000:])
    run_dir = ROOT / "runs" / ours[0]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["actor_steps"] >= _budget_steps(to_run) and summary["checkpoints"], summary
    assert (run_dir / "checkpoints" / summary["checkpoints"][-1]).is_dir()
    assert str(run_dir) in stdout.strip().splitlines()[-1], stdout[-3000:]  # where the run is, last
  finally:
    for name in ours:
      shutil.rmtree(ROOT / "runs" / name)


RUN = [c for c in COMMANDS if c in BUDGETS]


@pytest.mark.parametrize("command", RUN, ids=[re.sub(r"^\.venv/bin/python -m ", "", c) for c in RUN])
def test_readme_command_runs_as_typed(command, workdir, capsys):
  to_run = as_run(command, workdir)
  before = _runs_entries()
  start = time.perf_counter()
  result = subprocess.run(to_run, shell=True, cwd=ROOT, capture_output=True, text=True, timeout=900,
                          env=dict(os.environ, PYTHONUNBUFFERED="1"))
  seconds = time.perf_counter() - start
  output = result.stdout + result.stderr
  with capsys.disabled():
    print(f"\n  {seconds:6.1f} s  exit {result.returncode}  {to_run}")
  if _writes_default_run_dir(command):
    _check_and_remove_our_run_dir(before, to_run, result)
  assert result.returncode == 0, output[-5000:]
  for expected in EXPECT.get(command, []):
    if "/" in expected:
      assert (workdir / expected).exists(), f"{expected} missing after: {to_run}\n{output[-3000:]}"
    else:
      assert expected in output, f"'{expected}' not printed by: {to_run}\n{output[-3000:]}"
