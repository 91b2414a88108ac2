"""Multi-seed sweeps (launch.sweep) and reports (launch.report, jrl.experiment.sweep_report):
real launch.train subprocesses, numbers checked against rliable on the same score matrix."""

import csv
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from rliable import library, metrics

from jrl.errors import ConfigError
from jrl.experiment import sweep_report
from launch import sweep

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHORT = ["--deterministic", "--steps", "3000", "--eval_every", "1000", "--eval_episodes", "5",
         "--progress_seconds", "0"]
REPS = 2000
PNGS = sorted(sweep_report.FIGURES.values())


def _run(module, *args):
  return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, text=True, capture_output=True,
                        timeout=300)


def _rliable(scores, metric, reps=REPS, seed=0):
  """rliable's own point estimate and CI; its bootstrap draws from np.random, so seed it too."""
  np.random.seed(seed)
  points, cis = library.get_interval_estimates({"x": scores}, metric, reps=reps,
                                               random_state=np.random.RandomState(seed))
  return [float(points["x"]), *np.asarray(cis["x"]).ravel().tolist()]


def _summary(run_dir):
  with open(os.path.join(run_dir, "summary.json")) as f:
    return json.load(f)


@pytest.fixture(scope="module")
def dqn_sweep(tmp_path_factory):
  out = str(tmp_path_factory.mktemp("sweeps") / "dqn")
  proc = _run("launch.sweep", "--agent", "dqn", "--env", "CartPole-v1", "--seeds", "0-2", "--parallel", "2",
              "--run_dir", out, "--reps", str(REPS), *SHORT)
  return proc, out


@pytest.fixture(scope="module")
def ppo_sweep(tmp_path_factory):
  """PPO over seeds 0 and 1, where seed 1's run directory is taken by a file: launch.train refuses it."""
  out = tmp_path_factory.mktemp("sweeps") / "ppo"
  out.mkdir()
  (out / sweep_report.run_dir_name("ppo", "CartPole-v1", 1)).write_text("not a folder\n")
  proc = _run("launch.sweep", "--agent", "ppo", "--seeds", "0,1", "--run_dir", str(out), "--reps", str(REPS),
              "--deterministic", "--steps", "2000", "--eval_every", "1000", "--eval_episodes", "5")
  return proc, str(out)


@pytest.mark.slow  # runs a sweep of real launch.train processes
def test_three_seed_dqn_sweep_writes_report(dqn_sweep):
  proc, out = dqn_sweep
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
  for seed in range(3):
    assert f"[sweep] seed {seed}: done" in proc.stdout
  assert "3/3 seeds finished" in proc.stdout
  for name in ("report.md", "report.json", "sweep.json", *PNGS):
    assert os.path.getsize(os.path.join(out, name)) > 0, name
  for name in PNGS:
    with open(os.path.join(out, name), "rb") as f:
      assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  with open(os.path.join(out, "report.json")) as f:
    report = json.load(f)
  (group,) = report["groups"]
  assert (group["agent"], group["env"], group["seeds"]) == ("dqn", "CartPole-v1", [0, 1, 2])
  # The score is each run's final evaluation: summary.json's eval_return = evaluator.csv's last row.
  for seed, score in zip(group["seeds"], group["scores"]):
    run_dir = os.path.join(out, sweep_report.run_dir_name("dqn", "CartPole-v1", seed))
    summary = _summary(run_dir)
    assert summary["seed"] == seed and summary["actor_steps"] == 3000
    with open(os.path.join(run_dir, "metrics", "evaluator.csv")) as f:
      rows = list(csv.DictReader(f))
    assert [int(r["actor_steps"]) for r in rows] == [1000, 2000, 3000]
    assert score == summary["eval_return"] == float(rows[-1]["eval_return"])
  assert len(set(group["scores"])) == 3  # different seeds, different runs
  curve = group["curve"]
  assert curve["steps"] == [1000, 2000, 3000]
  assert all(lo <= iqm <= hi for lo, iqm, hi in zip(curve["low"], curve["iqm"], curve["high"]))
  text = open(os.path.join(out, "report.md")).read()
  assert "final evaluation return" in text and "stratified bootstrap" in text
  assert f"| dqn | CartPole-v1 | 3 | {group['iqm']['point']:.1f} [{group['iqm']['low']:.1f}, " in text


@pytest.mark.slow  # runs a sweep of real launch.train processes
def test_report_iqm_and_cis_equal_rliable(dqn_sweep):
  """The report's IQM and mean, with CIs, are rliable's on the runs' score matrix, same bootstrap seed."""
  _, out = dqn_sweep
  with open(os.path.join(out, "report.json")) as f:
    (group,) = json.load(f)["groups"]
  scores = np.array([[_summary(os.path.join(out, sweep_report.run_dir_name("dqn", "CartPole-v1", s)))["eval_return"]]
                     for s in (0, 1, 2)])
  for name, metric in (("iqm", metrics.aggregate_iqm), ("mean", metrics.aggregate_mean)):
    reported = group[name]
    assert [reported["point"], reported["low"], reported["high"]] == _rliable(scores, metric)
  assert group["iqm"]["low"] < group["iqm"]["point"] < group["iqm"]["high"]


def _run_record(seed, score, agent="a", env="E", threshold=10.0, reached=None):
  steps = np.array([100, 200])
  return sweep_report.Run(f"runs/{agent}-{seed}", agent, env, seed, True, score, score, threshold, reached, 200,
                          1.0, steps, np.array([0.0, score]))


def test_aggregates_are_rliables_and_independent_of_the_other_groups():
  """On 8 runs (the IQM trims 2 each side, CIs depend on the bootstrap seed) and with another
  group in the same report: each group's numbers are rliable's on its matrix alone."""
  scores = [3.0, 9.0, 1.0, 7.0, 4.0, 12.0, 5.0, 8.0]
  runs = [_run_record(s, x) for s, x in enumerate(scores)]
  other = [_run_record(s, 2.0 * s, agent="b") for s in range(5)]
  state = np.random.get_state()
  report = sweep_report.build_report(other + runs, reps=REPS, seed=7, curve_reps=200)
  assert np.array_equal(np.random.get_state()[1], state[1])  # the global RNG is left as it was
  group = next(g for g in report["groups"] if g["agent"] == "a")
  assert group["scores"] == scores  # by seed
  matrix = np.array(scores)[:, None]
  assert group["iqm"]["point"] == pytest.approx(np.mean([4.0, 5.0, 7.0, 8.0]))  # middle half, by hand
  for name, metric in (("iqm", metrics.aggregate_iqm), ("mean", metrics.aggregate_mean)):
    assert [group[name][k] for k in ("point", "low", "high")] == _rliable(matrix, metric, seed=7)
  alone = sweep_report.build_report(runs, reps=REPS, seed=7, curve_reps=200)["groups"][0]
  assert alone["iqm"] == group["iqm"] and alone["mean"] == group["mean"]
  reseeded = sweep_report.build_report(runs, reps=REPS, seed=8, curve_reps=200)["groups"][0]
  assert reseeded["iqm"]["point"] == group["iqm"]["point"] and reseeded["iqm"] != group["iqm"]


def test_steps_to_threshold_and_across_env_scores():
  runs = [_run_record(0, 12.0, reached=100), _run_record(1, 4.0), _run_record(2, 11.0, reached=200),
          _run_record(0, 300.0, env="F", threshold=200.0, reached=200),
          _run_record(1, 100.0, env="F", threshold=200.0)]
  report = sweep_report.build_report(runs, reps=200, curve_reps=100)
  stats = report["groups"][0]["steps_to_threshold"]
  assert (stats["steps"], stats["reached"], stats["runs"], stats["median"]) == ([100, None, 200], 2, 3, 150.0)
  (across,) = report["across_envs"]
  assert across["envs"] == ["E", "F"] and across["runs_per_env"] == 2  # the fewer runs of F
  assert across["scores"] == [[1.2, 1.5], [0.4, 0.5]]  # score / threshold, by seed


@pytest.mark.slow  # runs a sweep of real launch.train processes
def test_failed_seed_is_reported_and_the_others_finish(ppo_sweep):
  proc, out = ppo_sweep
  assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
  assert "[sweep] seed 0: done" in proc.stdout
  failed_line = next(line for line in proc.stdout.splitlines() if line.startswith("[sweep] seed 1: FAILED"))
  assert "exit 2" in failed_line and "run_dir" in failed_line and "not a folder" in failed_line
  assert "1/2 seeds finished, failed: 1" in proc.stdout
  with open(os.path.join(out, "sweep.json")) as f:
    record = {r["seed"]: r for r in json.load(f)["runs"]}
  assert record[0]["status"] == "ok" and record[1]["status"] == "failed" and record[1]["returncode"] == 2
  with open(os.path.join(out, "report.json")) as f:
    (group,) = json.load(f)["groups"]
  assert group["seeds"] == [0] and group["scores"] == [_summary(os.path.join(out, "ppo-CartPole-v1-s0"))["eval_return"]]
  assert [f["seed"] for f in group["failed"]] == [1]
  assert "| ppo | CartPole-v1 | 1 | FAILED: exit 2" in open(os.path.join(out, "report.md")).read()


@pytest.mark.slow  # runs a sweep of real launch.train processes
def test_report_compares_two_agents(dqn_sweep, ppo_sweep, tmp_path):
  out = str(tmp_path / "compare")
  proc = _run("launch.report", dqn_sweep[1], ppo_sweep[1], "--out", out, "--reps", str(REPS))
  assert proc.returncode == 0, proc.stderr
  with open(os.path.join(out, "report.json")) as f:
    groups = {g["agent"]: g for g in json.load(f)["groups"]}
  assert sorted(groups) == ["dqn", "ppo"]
  with open(os.path.join(dqn_sweep[1], "report.json")) as f:
    (own,) = json.load(f)["groups"]
  assert groups["dqn"]["iqm"] == own["iqm"] and groups["dqn"]["mean"] == own["mean"]  # rebuilt: same numbers
  assert groups["ppo"]["seeds"] == [0] and [f["seed"] for f in groups["ppo"]["failed"]] == [1]
  text = open(os.path.join(out, "report.md")).read()
  assert "| dqn | CartPole-v1 | 3 |" in text and "| ppo | CartPole-v1 | 1 (1 failed) |" in text
  for name in PNGS:
    assert os.path.getsize(os.path.join(out, name)) > 0
  assert "report: 5 runs in 2 groups" in proc.stdout


@pytest.mark.slow  # runs a sweep of real launch.train processes
def test_rerun_reuses_finished_seeds_and_refuses_other_settings(dqn_sweep, capsys):
  _, out = dqn_sweep
  digests = [_summary(os.path.join(out, f"dqn-CartPole-v1-s{s}"))["params_digest"] for s in range(3)]
  assert sweep.main(["--seeds", "0-2", "--run_dir", out, "--reps", "100", *SHORT]) == 0
  text = capsys.readouterr().out
  assert text.count("finished earlier with the same settings; reused") == 3 and "started" not in text
  assert [_summary(os.path.join(out, f"dqn-CartPole-v1-s{s}"))["params_digest"] for s in range(3)] == digests
  with pytest.raises(SystemExit) as exit_info:
    sweep.main(["--seeds", "0-2", "--run_dir", out, *SHORT, "--eval_every", "500"])
  assert exit_info.value.code == 2
  err = capsys.readouterr().err.strip()
  assert err.count("\n") == 0 and "run_dir: " in err and "already holds a run with other settings" in err
  sweep.main(["--seeds", "0-2", "--run_dir", out, "--reps", str(REPS), *SHORT])  # the fixture's report again


def test_bad_seeds_exit_2_with_one_line_and_run_nothing(tmp_path):
  out = tmp_path / "sweep"
  proc = _run("launch.sweep", "--seeds", "3-1", "--run_dir", str(out), *SHORT)
  assert proc.returncode == 2
  assert proc.stderr.strip().count("\n") == 0 and "seeds" in proc.stderr and "3-1" in proc.stderr
  assert not out.exists()


@pytest.mark.parametrize("args, field", [
    (["--seeds", ""], "seeds"), (["--seeds", "0,x"], "seeds"), (["--seeds", "1,1"], "seeds"),
    (["--seeds", "0-1", "--stepz", "5"], "--stepz"), (["--seeds", "0-1", "--seed", "4"], "seed"),
    (["--seeds", "0-1", "--steps", "0"], "steps"), (["--seeds", "0-1", "--parallel", "0"], "parallel"),
    (["--seeds", "0-1", "--env", "NoSuchEnv-v0"], "env"),
    (["--seeds", "0-2", "--parallel", str(len(sweep.usable_cores()) + 1), "--one_core_each"], "one_core_each"),
    (["--seeds", "0-2", "--backend", "device", "--env", "gymnax:CartPole-v1", "--agent", "ppo", "--one_core_each"],
     "one_core_each"),
])
def test_bad_input_is_caught_before_any_seed_runs(tmp_path, capsys, args, field):
  out = tmp_path / "sweep"
  with pytest.raises(SystemExit) as exit_info:
    sweep.main([*args, "--run_dir", str(out)])
  assert exit_info.value.code == 2
  err = capsys.readouterr().err.strip()
  assert err.count("\n") == 0 and err.startswith("python -m launch.sweep: error:") and field in err
  assert not out.exists()


def test_parse_seeds():
  assert sweep_report.parse_seeds("0-4") == [0, 1, 2, 3, 4]
  assert sweep_report.parse_seeds("0,2,5") == [0, 2, 5]
  assert sweep_report.parse_seeds("3") == [3]
  assert sweep_report.parse_seeds(" 0-2, 7 ") == [0, 1, 2, 7]
  for bad in ("3-1", "", "-1", "a", "0-", "1,,2", "2,1-3"):
    with pytest.raises(ConfigError, match="^seeds: "):
      sweep_report.parse_seeds(bad)


@pytest.mark.slow  # runs a sweep of real launch.train processes
def test_importing_and_reporting_leave_matplotlib_alone(dqn_sweep, tmp_path):
  """No pyplot and no backend switch, at import or while writing a report."""
  # rcParams' raw entry: reading matplotlib.get_backend() would itself resolve (and set) one.
  code = ("import sys, matplotlib; backend = lambda: dict.__getitem__(matplotlib.rcParams, 'backend'); "
          "before = backend(); "
          "import jrl.experiment.sweep_report as r, launch.sweep, launch.report; "
          "assert 'matplotlib.pyplot' not in sys.modules; "
          f"r.write_report({str(tmp_path)!r}, r.load_runs([{dqn_sweep[1]!r}]), reps=100, curve_reps=100); "
          "assert 'matplotlib.pyplot' not in sys.modules; "
          "assert backend() == before, (before, backend()); print('ok')")
  proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, text=True, capture_output=True, timeout=120)
  assert proc.stdout.strip() == "ok", proc.stderr[-2000:]


def test_one_core_each_pins_every_run_to_a_free_core_of_its_own_with_xla_on_one_thread(tmp_path, monkeypatch):
  # Three jobs, two at a time, each a real process that reports where it may run and its XLA flags.
  monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/nowhere")  # the user's own flags are kept, ours after them
  report = ("import json, os, sys, time; time.sleep(0.5); "
            "print(json.dumps([sorted(os.sched_getaffinity(0)), os.environ['XLA_FLAGS']]))")
  jobs = [sweep.Job(seed, f"s{seed}", [sys.executable, "-c", report]) for seed in range(3)]
  ended = []
  outcomes = sweep.run_jobs(jobs, 2, str(tmp_path / "logs"), ended.append, one_core_each=True)
  assert [o.returncode for o in outcomes] == [0, 0, 0]
  seen = {}
  for seed in range(3):
    cores, flags = json.loads(open(tmp_path / "logs" / f"s{seed}.log").read().strip().splitlines()[-1])
    seen[seed] = cores
    assert flags == "--xla_dump_to=/nowhere " + sweep.ONE_CORE_XLA_FLAGS
  usable = sweep.usable_cores()
  assert all(len(cores) == 1 and cores[0] in usable[:2] for cores in seen.values()), seen
  if len(usable) >= 2:
    assert seen[0] != seen[1]  # the first two ran at once: a core each
