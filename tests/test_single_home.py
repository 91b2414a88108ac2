"""Evaluation scheduling, policy snapshots and the summary have one home: the run core
(jrl/run/core.py). Every kind of run (embedded, device, the distributed program) goes
through it; a second copy of any of them elsewhere in the tree fails here.

Read from the source with `ast` (no imports): calls of `save_policy`/`save_snapshot`,
`make_summary`, `plot_learning_curve(s)`, an `EvalHistory`'s `record`, and writes whose path names
SUMMARY_FILE (or "summary.json")."""

import ast
import os
from typing import Dict, List, Set

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOME = "jrl/run/core.py"
FOLDERS = ("jrl", "launch", "bench", "examples", "scripts")
SNAPSHOT_CALLS = {"save_policy", "save_snapshot"}
SUMMARY_CALLS = {"make_summary"}
PLOT_CALLS = {"plot_learning_curve", "plot_learning_curves"}
WRITE_CALLS = {"write_json", "write_bytes_atomic", "write_text", "dump", "open"}


def _called_name(call: ast.Call) -> str:
  func = call.func
  return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


def _names_summary_file(node: ast.AST, summary_paths: Set[str]) -> bool:
  for sub in ast.walk(node):
    if isinstance(sub, ast.Name) and (sub.id == "SUMMARY_FILE" or sub.id in summary_paths):
      return True
    if isinstance(sub, ast.Attribute) and sub.attr == "SUMMARY_FILE":
      return True
    if isinstance(sub, ast.Constant) and sub.value == "summary.json":
      return True
  return False


def _opened_for_reading(call: ast.Call) -> bool:
  modes = [a.value for a in call.args[1:2] if isinstance(a, ast.Constant)]
  modes += [k.value.value for k in call.keywords if k.arg == "mode" and isinstance(k.value, ast.Constant)]
  return not modes or all(isinstance(m, str) and "r" in m and "+" not in m for m in modes)


def homes(source: str) -> Dict[str, List[int]]:
  """What `source` does that only the run core may do: {what: [line, ...]}."""
  tree = ast.parse(source)
  found: Dict[str, List[int]] = {}
  # Names bound to a path that names the summary (summary_path = os.path.join(run_dir, SUMMARY_FILE)).
  summary_paths = {target.id for node in ast.walk(tree) if isinstance(node, ast.Assign)
                   and _names_summary_file(node.value, set())
                   for target in node.targets if isinstance(target, ast.Name)}
  # Names bound to an evaluation history (EvalHistory(...), EvalHistory.from_state(...)).
  histories = set()
  for node in ast.walk(tree):
    if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
      if any(isinstance(s, ast.Name) and s.id == "EvalHistory" for s in ast.walk(node.value)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        histories |= {t.id if isinstance(t, ast.Name) else t.attr for t in targets
                      if isinstance(t, (ast.Name, ast.Attribute))}
    if isinstance(node, ast.arg) and isinstance(node.annotation, ast.Name) and node.annotation.id == "EvalHistory":
      histories.add(node.arg)
  for node in ast.walk(tree):
    if not isinstance(node, ast.Call):
      continue
    name = _called_name(node)
    what = None
    if name in SNAPSHOT_CALLS:
      what = "policy snapshot"
    elif name in SUMMARY_CALLS:
      what = "summary"
    elif name in PLOT_CALLS:
      what = "learning curve"
    elif name in WRITE_CALLS and any(_names_summary_file(a, summary_paths) for a in node.args):
      if not (name == "open" and _opened_for_reading(node)):
        what = "summary write"
    elif name == "record" and isinstance(node.func, ast.Attribute):
      owner = node.func.value
      owner_name = owner.id if isinstance(owner, ast.Name) else owner.attr if isinstance(owner, ast.Attribute) else ""
      if owner_name in histories or (isinstance(owner, ast.Call) and _called_name(owner) in {"EvalHistory",
                                                                                             "from_state"}):
        what = "evaluation record"
    if what:
      found.setdefault(what, []).append(node.lineno)
  return found


def tree_homes() -> Dict[str, Dict[str, List[int]]]:
  """{file relative to the repository: homes(its source)} over the tree's Python, for the files with any."""
  out = {}
  for folder in FOLDERS:
    for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, folder)):
      dirnames[:] = [d for d in dirnames if not d.startswith(".") and d != "__pycache__"]
      for filename in filenames:
        if filename.endswith(".py"):
          path = os.path.join(dirpath, filename)
          with open(path) as f:
            found = homes(f.read())
          if found:
            out[os.path.relpath(path, ROOT)] = found
  return out


def test_the_run_core_is_the_one_home_of_evaluations_snapshots_and_the_summary():
  found = tree_homes()
  elsewhere = {path: what for path, what in found.items() if path != HOME}
  assert not elsewhere, f"only {HOME} may do these (a second copy): {elsewhere}"
  assert set(found[HOME]) == {"policy snapshot", "summary", "learning curve", "summary write", "evaluation record"}


@pytest.mark.parametrize("source, expected", [
    ("save_policy(run_dir, 'best', p, {})", {"policy snapshot": [1]}),
    ("from jrl import policies\npolicies.save_policy(d, 'final', p, {})", {"policy snapshot": [2]}),
    ("s = make_summary(exp=exp)", {"summary": [1]}),
    ("write_json(os.path.join(run_dir, SUMMARY_FILE), s)", {"summary write": [1]}),
    ("path = os.path.join(run_dir, files.SUMMARY_FILE)\nwrite_json(path, s)", {"summary write": [2]}),
    ("with open(os.path.join(d, 'summary.json'), 'w') as f:\n  json.dump(s, f)", {"summary write": [1]}),
    ("with open(os.path.join(d, SUMMARY_FILE)) as f:\n  s = json.load(f)", {}),  # reading is anyone's
    ("h = EvalHistory(None)\nh.record(10, [1.0])", {"evaluation record": [2]}),
    ("def f(history: EvalHistory):\n  return history.record(1, [0.0])", {"evaluation record": [2]}),
    ("self._history = EvalHistory.from_state(s)\nself._history.record(1, [0.0])", {"evaluation record": [2]}),
    ("EvalHistory(None).record(1, [2.0])", {"evaluation record": [1]}),
    ("logger.record(1)", {}),  # a record of something else
    ("plots.plot_learning_curve(run_dir, 'x', None)", {"learning curve": [1]}),
    ("plots.plot_learning_curves([plots.Curve(run_dir, 'x', None)])", {"learning curve": [1]}),
])
def test_each_kind_of_copy_is_found(source, expected):
  assert homes(source) == expected
