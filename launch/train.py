"""Train an agent.

  python -m launch.train --agent dqn --env CartPole-v1 --seed 0 --steps 50000 --run_dir DIR
  python -m launch.train --resume DIR [--steps N]     # continue DIR from its newest checkpoint

Every field of the experiment config and of the agent's config is a flag;
`--agent NAME --help` lists that agent's fields. A resumed run takes its config
from DIR/config.json; flags may only change what can change mid-run (--steps,
checkpoint and progress settings).

Ctrl-C or SIGTERM stops a run at its next safe point with a checkpoint of it, and exits 130
(SIGINT) or 143 (SIGTERM) naming that checkpoint; --resume continues from it.
"""

import argparse
import dataclasses
import os
import signal
import sys
from typing import Optional, Sequence

from jrl.run.distributed import faults
from launch.cli import (OneLineParser, add_dataclass_flags, add_grouped_flags, build_config, end_process, fail,
                        given_fields, with_preset)

PROG = "python -m launch.train"
FAULT_FLAGS = tuple(faults.FLAGS)  # jrl/run/distributed/faults.py's environment variable, as flags
# Set once an embedded or device run has finished and written everything (`cli.end_process`).
_finished_run = False


def main(argv: Optional[Sequence[str]] = None) -> int:
  global _finished_run
  argv = list(sys.argv[1:] if argv is None else argv)
  from jrl import compat
  from jrl.agents import get_agent
  from jrl.errors import ConfigError
  from jrl.experiment.config import DEVICE, DEVICE_HOSTS, DISTRIBUTED, ExperimentConfig
  from jrl.experiment import resume
  from jrl.experiment.checkpoint import RunWritesFailed
  from jrl.experiment.files import resolve_paths

  pre = argparse.ArgumentParser(add_help=False)
  pre.add_argument("--agent", default=None)
  pre.add_argument("--resume", default=None)
  known, _ = pre.parse_known_args(argv)
  if known.resume:
    known.resume = os.path.abspath(known.resume)
  try:
    agent_name = known.agent or ExperimentConfig.agent
    if known.resume:
      saved_agent = resume.saved_config(known.resume, "resume")["experiment"].get("agent")
      if known.agent and known.agent != saved_agent:
        raise ConfigError("agent", f"cannot change when resuming: the run has '{saved_agent}', got '{known.agent}'")
      agent_name = saved_agent
    agent = get_agent(agent_name)
  except ConfigError as e:
    fail(PROG, e)

  parser = make_parser(agent_name, agent)
  if "--list_presets" in argv:
    from jrl.experiment.presets import describe, load_presets
    try:
      print(f"{agent_name}'s presets (--preset NAME; your own flags win over a preset's):\n"
            + describe(load_presets(agent_name, agent)), end="")
    except ConfigError as e:
      fail(PROG, e)
    return 0
  try:
    argv = with_preset(argv, agent_name, agent)
  except ConfigError as e:
    fail(PROG, e)
  args = parser.parse_args(argv)
  exp = None

  try:
    if known.resume:
      exp, agent_cfg = resume.resumed_configs(known.resume, given_fields(ExperimentConfig, args),
                                              given_fields(agent.Config, args))
    else:
      exp = build_config(ExperimentConfig, args)
      agent_cfg = build_config(agent.Config, args)
    exp.check_given_flags(given_fields(ExperimentConfig, args))
    if not known.resume:
      exp = _seeded_replay_without_reverb(exp, given_fields(ExperimentConfig, args))
    _inject_faults(args, exp)
    exp = resolve_paths(exp)  # relative folders against the working directory, once
    if exp.scope == DEVICE_HOSTS and not exp.coordinator_address:
      from launch.device_hosts import run_device_on_hosts  # the launcher of its processes
      try:
        summary = run_device_on_hosts(exp, agent_cfg)
      except RuntimeError as e:  # a process or host failed; the report names it
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
      digests = summary["process_digests"]
      print(f"done: {summary['actor_steps']} env steps on {len(digests)} processes, eval "
            f"{summary['eval_return']:.1f} (best {summary['best_eval_return']:.1f}), steps to threshold "
            f"{summary['steps_to_threshold']}, final params digest "
            + (f"{digests[0][:16]} (every process)" if len(set(digests)) == 1 else f"differs: {', '.join(digests)}")
            + f" | {summary['run_dir']}", flush=True)
      return 0 if len(set(digests)) == 1 else 1
    if exp.mode == DEVICE:
      from jrl.run.device.runner import run_device  # gymnax envs; checks the env id itself
      run_device(exp, agent_cfg)
      _finished_run = True
      return 0
    from jrl.cpu_jit import dispatch_synchronously
    dispatch_synchronously()  # before the first array: see its docstring
    from jrl.envs import check_env_id
    check_env_id(exp.env)
    if exp.mode == DISTRIBUTED:
      from launch.ray_program import check_ray_installed, default_engine
      if not exp.engine:  # what the stack has; config.json then says which
        exp = dataclasses.replace(exp, engine=default_engine())
      if exp.engine == "launchpad":
        compat.check_distributed_stack("engine" if "engine" in given_fields(ExperimentConfig, args) else "distributed",
                                       "--distributed on Launchpad")
        from launch.distributed import run_distributed as run_program
      else:
        check_ray_installed()
        if exp.launcher != "local":
          raise ConfigError("launcher", f"--launcher {exp.launcher} launches a Launchpad program, which needs "
                                        f"{compat.FULL_STACK_HINT}; on Ray, start it on the hosts (`ray start`) and "
                                        "join it with --ray_address")
        from launch.ray_program import run_on_ray as run_program
      try:
        summary = run_program(exp, agent_cfg)
      except RuntimeError as e:  # a node failed; the report names it and its error
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
      details = summary["details"]
      batch_mean = details["inference_batch_mean"]  # None without inference servers
      print(f"done: {summary['actor_steps']} env steps, eval {summary['eval_return']:.1f} "
            f"(best {summary['best_eval_return']:.1f}), steps to threshold {summary['steps_to_threshold']}, "
            + (f"inference batch mean {batch_mean:.2f}, " if batch_mean is not None else "")
            + f"policy lag mean {details['policy_lag_mean']:.2f}"
            + (f", lost hosts {', '.join(details['lost_hosts'])} (nodes {', '.join(details['lost_nodes'])})"
               if details["lost_hosts"] else "") + f" | {summary['run_dir']}", flush=True)
    else:
      if not args.verbose:
        from launch.quiet import hide_native_chatter
        hide_native_chatter()  # Reverb's C++ info lines
      from jrl.run.embedded import run
      run(exp, agent_cfg)  # unexpected errors keep their traceback
      _finished_run = True
  except ConfigError as e:
    fail(PROG, e)
  except RunWritesFailed as e:  # the run's summary and report are written; some checkpoint is not
    _finished_run = exp.mode != DISTRIBUTED
    print(f"{PROG}: error: {e}", file=sys.stderr)
    return 1
  except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM: RunInterrupted after the run's checkpoint
    from jrl.experiment.interrupt import exit_status
    signum = getattr(e, "signum", None)
    how = f"interrupted ({signal.Signals(signum).name})" if signum else "interrupted"
    print(f"{PROG}: {how}; {_where_to_continue(exp.run_dir, e) if exp is not None else 'nothing was written'}",
          file=sys.stderr)
    return exit_status(signum or signal.SIGINT)
  return 0


def _seeded_replay_without_reverb(exp, given):
  """On the core stack (no Reverb), an embedded run whose --deterministic is not given replays from the
  seeded in-process buffer, as --deterministic does, and says so in a line; a run that asks for Reverb
  (`--deterministic false`) is refused by the embedded runner in one line."""
  from jrl import compat
  from jrl.experiment.config import EMBEDDED
  if exp.mode != EMBEDDED or exp.deterministic or "deterministic" in given or "reverb" not in compat.missing_distributed_stack():
    return exp
  print("[run] Reverb is not installed (the core stack): replay is the seeded in-process buffer, as with "
        "--deterministic", flush=True)
  return dataclasses.replace(exp, deterministic=True)


def _inject_faults(args, exp) -> None:
  """--crash_* flags -> jrl/run/distributed/faults.py's environment variable, which the program's nodes read."""
  from jrl.errors import ConfigError
  from jrl.experiment.config import DISTRIBUTED
  given = {flag: getattr(args, flag) for flag in FAULT_FLAGS if getattr(args, flag) is not None}
  if not given:
    return
  if exp.mode != DISTRIBUTED:
    raise ConfigError(next(iter(given)), "applies to --distributed runs only")
  faults.to_environment(faults.Faults(**{faults.FLAGS[flag]: value for flag, value in given.items()}))


def _where_to_continue(run_dir: str, interrupt: Optional[BaseException] = None) -> str:
  """What an interrupted run kept (the checkpoint it wrote as it stopped, when it did), and the
  command that continues it."""
  from jrl.experiment.checkpoint import describe_latest
  written = getattr(interrupt, "checkpoint", None)
  if written is not None:
    return (f"checkpoint written at {interrupt.env_steps} env steps ({os.path.relpath(written, run_dir)}); "
            f"continue with: {PROG} --resume {run_dir}")
  latest = describe_latest(run_dir)
  if latest is None:
    return f"{run_dir} has no checkpoint yet; the same command starts it over"
  return f"the last checkpoint is {latest}; continue with: {PROG} --resume {run_dir}"


def make_parser(agent_name: str, agent, prog: str = PROG) -> OneLineParser:
  """The run's command line: one flag per field of the experiment config and of the agent's
  config (launch.sweep checks its pass-through flags with the same parser)."""
  from jrl.agents import AGENTS
  from jrl.experiment.config import FIELD_GROUPS, GROUPS, ExperimentConfig
  parser = OneLineParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  add_grouped_flags(parser, ExperimentConfig, FIELD_GROUPS, notes={group.name: group.used_by() for group in GROUPS})
  add_dataclass_flags(parser, agent.Config, f"agent '{agent_name}' (known agents: {', '.join(sorted(AGENTS))})")
  parser.add_argument("--verbose", action="store_true",
                      help="also show native libraries' info lines (Reverb's '[reverb/cc/...]')")
  parser.add_argument("--list_presets", action="store_true",
                      help="list the agent's presets (its presets.yaml: name, what it is for, its flags) and exit")
  for flag in FAULT_FLAGS:  # the project's fault tests (jrl/run/distributed/faults.py); not listed
    parser.add_argument(f"--{flag}", type=int, default=None, help=argparse.SUPPRESS)
  return parser


if __name__ == "__main__":
  end_process(main(), _finished_run)
