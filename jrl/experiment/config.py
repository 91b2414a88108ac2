"""Experiment configuration: what to run, for how long, and where results go.

The fields come in groups by concern, each its own frozen dataclass that owns its fields' defaults,
comments and checks, and says which modes of run use it: `RunSettings`, `LearnerSettings`,
`CheckpointSettings`, `DistributedSettings`, `LauncherSettings`, `DeviceSettings`. A run's mode is
one derived value, `ExperimentConfig.mode`: 'embedded' (one process), 'distributed' (a Launchpad
program) or 'device' (one compiled loop); a device run whose processes a launcher places on hosts
is checked as 'device over hosts' (`ExperimentConfig.scope`).

`ExperimentConfig` is all the groups at once, one flat frozen dataclass (it inherits every group's
fields): its fields are the flags of `launch.train` and the keys of a run's `config.json`, and
`exp.steps`, `dataclasses.replace(exp, steps=...)` read and change them as before.
`exp.settings("distributed")` is one group's fields as that group's dataclass (checked as it is
made). A field given for a mode that does not use it (`check_given_flags`) is refused naming the
field and its group.
"""

import dataclasses
import time
from typing import Dict, FrozenSet, NamedTuple, Optional, Tuple, Type, Union

from jrl.errors import ConfigError, require_non_negative, require_positive
from jrl.experiment.files import path_safe

# The modes of run. `mode` is one of the first three; groups and fields say which of all four use them.
EMBEDDED = "embedded"          # one process: the embedded runner (jrl.run.embedded)
DISTRIBUTED = "distributed"    # a Launchpad program (launch.distributed)
DEVICE = "device"              # one compiled loop on this host's devices (jrl.run.device.runner)
DEVICE_HOSTS = "device over hosts"  # a device run whose processes a launcher puts on hosts (launch.device_hosts)
MODES = (EMBEDDED, DISTRIBUTED, DEVICE, DEVICE_HOSTS)
EVERY_MODE = frozenset(MODES)

# A run of each mode, in a sentence ("which an embedded run does not use").
_A_RUN = {EMBEDDED: "an embedded run", DISTRIBUTED: "a distributed run", DEVICE: "a device run on one host",
          DEVICE_HOSTS: "a device run over hosts"}
# How a run of one mode (first) becomes one of another (second): the flags to add or drop.
_SWITCH = {
    (EMBEDDED, DISTRIBUTED): "add --distributed",
    (EMBEDDED, DEVICE): "add --backend device",
    (EMBEDDED, DEVICE_HOSTS): "add --backend device --launcher slurm (or template)",
    (DISTRIBUTED, EMBEDDED): "drop --distributed",
    (DISTRIBUTED, DEVICE): "use --backend device instead of --distributed",
    (DISTRIBUTED, DEVICE_HOSTS): "use --backend device instead of --distributed",
    (DEVICE, EMBEDDED): "drop --backend device",
    (DEVICE, DISTRIBUTED): "use --distributed instead of --backend device",
    (DEVICE, DEVICE_HOSTS): "add --launcher slurm (or template)",
    (DEVICE_HOSTS, EMBEDDED): "drop --backend device and --launcher",
    (DEVICE_HOSTS, DISTRIBUTED): "use --distributed instead of --backend device",
    (DEVICE_HOSTS, DEVICE): "drop --launcher",
}


class FieldModes(NamedTuple):
  """A field's modes where they differ from its group's, and why."""
  modes: FrozenSet[str]
  why: str


class Group(NamedTuple):
  """One group of the experiment's fields: its `--help` heading, the modes that use its fields
  and the dataclass that declares them."""
  name: str                          # "distributed": exp.settings(name), the --help heading
  description: str                   # the rest of the heading
  modes: FrozenSet[str]              # the modes that use the group's fields
  cls: Type                          # the dataclass of its fields
  field_modes: Dict[str, FieldModes]  # fields that a different set of modes uses than the group

  def fields(self) -> Tuple[str, ...]:
    return tuple(field.name for field in dataclasses.fields(self.cls))

  def modes_of(self, name: str) -> FrozenSet[str]:
    return self.field_modes[name].modes if name in self.field_modes else self.modes

  def used_by(self) -> str:
    """Which runs use the group's fields, in words (its note in `--help`)."""
    def runs(modes: FrozenSet[str]) -> str:
      if modes == EVERY_MODE:
        return "every run"
      if len(modes) == len(MODES) - 1:
        return f"all but {next(iter(EVERY_MODE - modes))} runs"
      return _listed([mode for mode in MODES if mode in modes]) + " runs"
    by_modes: Dict[FrozenSet[str], list] = {}
    for name, field in self.field_modes.items():
      by_modes.setdefault(field.modes, []).append(f"--{name}")
    return "; ".join([f"used by {runs(self.modes)}", *(f"{', '.join(names)}: {runs(modes)}"
                                                        for modes, names in by_modes.items())])


_GROUPS = []  # filled by @settings_group in --help order


def settings_group(name: str, description: str, modes=EVERY_MODE,
                   field_modes: Optional[Dict[str, FieldModes]] = None):
  """Registers a settings dataclass as the group `name` (class decorator)."""
  def register(cls: Type) -> Type:
    entry = Group(name, description, frozenset(modes), cls, dict(field_modes or {}))
    unknown = set(entry.field_modes) - set(entry.fields())
    if unknown or not entry.modes <= EVERY_MODE or any(not m.modes <= EVERY_MODE for m in entry.field_modes.values()):
      raise ValueError(f"group '{name}': unknown fields {sorted(unknown)} or modes")
    _GROUPS.append(entry)
    return cls
  return register


class Settings:
  """Base of the groups: a group's dataclass checks its own fields when it is made."""

  def __post_init__(self):
    type(self).check(self)

  def check(self) -> None:
    """ConfigError naming the field for a bad value of this group's own fields."""


# Reasons a field of an otherwise shared group is not used by every mode.
_NOT_DISTRIBUTED = EVERY_MODE - {DISTRIBUTED}


@settings_group("run", "what to train, for how long, evaluation and logging", field_modes={
    "deterministic": FieldModes(_NOT_DISTRIBUTED, "Reverb's samplers cannot be seeded, so a distributed run is "
                                                  "not bit-reproducible"),
    "log_every": FieldModes(_NOT_DISTRIBUTED, "distributed nodes write a metrics row every second"),
    "actor_device": FieldModes(frozenset({EMBEDDED}), "where an embedded run's policy acts: actor nodes run on the "
                                                      "CPU (jrl.accelerators), --inference server batches them on a "
                                                      "GPU, a device run acts inside its compiled loop"),
})
@dataclasses.dataclass(frozen=True)
class RunSettings(Settings):
  """What to train, for how long, how it is evaluated and logged (every mode)."""
  agent: str = "dqn"                 # agent name (jrl.agents.AGENTS), or a module pkg.module with the five pieces
  env: str = "CartPole-v1"           # gymnasium environment id, or pkg.module:function returning a gymnasium env
  seed: int = 0                      # seeds envs, networks, policies and replay sampling
  steps: int = 50_000                # env-step budget of the actors
  run_dir: str = ""                  # results folder; empty means runs/<agent>-<env>-s<seed>-<time>
  preset: str = ""                   # a named set of the agent's hyperparameters (--list_presets), applied before
                                     # the other flags, which win
  deterministic: bool = False        # seeded in-process replay instead of Reverb: same seed, same bytes
  num_envs: int = 8                  # envs stepped together by the actor
  env_groups: int = 1                # the actor's envs step as this many groups in turn, each group's next
                                     # actions computed while the others step (2: halves; pays for CNNs)
  actor_device: str = "auto"         # where an embedded run's policy acts: 'cpu', 'accelerator' (the learner's
                                     # first device), or 'auto': by the policy's FLOPs per step (jrl.accelerators)
  eval_every: int = 2_500            # env steps between evaluations
  eval_episodes: int = 10            # greedy episodes per evaluation
  stop_at_threshold: bool = False    # end the run once eval reaches the reward threshold
  reward_threshold: Optional[float] = None  # success threshold; None takes the env's gymnasium spec
  log_every: int = 1_000             # env steps between metric rows
  progress_seconds: float = 2.0      # seconds between progress lines; 0 silences them

  def check(self) -> None:
    require_positive(self, "steps", "num_envs", "eval_every", "eval_episodes", "log_every")
    if self.env_groups < 1 or self.num_envs % self.env_groups:
      raise ConfigError("env_groups", f"must be >= 1 and divide num_envs={self.num_envs}, got {self.env_groups}")
    if self.actor_device not in ("auto", "cpu", "accelerator"):
      raise ConfigError("actor_device", f"must be 'auto', 'cpu' or 'accelerator', got '{self.actor_device}'")
    require_non_negative(self, "progress_seconds")


@settings_group("learner", "updates, devices and the batch pipeline", field_modes={
    "process_id": FieldModes(_NOT_DISTRIBUTED, "a distributed program numbers its learner processes itself"),
})
@dataclasses.dataclass(frozen=True)
class LearnerSettings(Settings):
  """The learner: its updates, its devices and processes, its batches (every mode)."""
  updates_per_call: int = 4          # SGD updates per jitted learner call (lax.scan)
  learner_devices: int = 0           # devices of the learner's data-parallel mesh; 0 = all
  coordinator_address: str = ""      # host:port of process 0, to span the learner mesh over processes
  num_processes: int = 1             # learner processes joined through jax.distributed
  process_id: int = 0                # this process's index among num_processes
  prefetch: int = 2                  # learner batches prepared ahead (Reverb runs)

  def check(self) -> None:
    require_positive(self, "updates_per_call", "prefetch")
    if self.learner_devices < 0:
      raise ConfigError("learner_devices", f"must be >= 0 (0 = all), got {self.learner_devices}")
    if not 0 <= self.process_id < self.num_processes:
      raise ConfigError("process_id", f"must be in [0, num_processes={self.num_processes}), got {self.process_id}")


@settings_group("checkpoints", "checkpoints and resume")
@dataclasses.dataclass(frozen=True)
class CheckpointSettings(Settings):
  """When a run writes checkpoints, how many it keeps, and what it resumes from (every mode)."""
  resume: str = ""                   # run directory to continue from its newest intact checkpoint
  resume_strict: bool = False        # refuse to resume when the newest checkpoint is damaged; without it the run
                                     # continues from the newest intact one (damaged ones: checkpoints/damaged/)
  checkpoint_every_seconds: float = 600.0  # wall seconds between checkpoints; 0 = not by time
  checkpoint_every_steps: int = 0    # env steps between checkpoints; 0 = not by steps
  keep_checkpoints: int = 3          # newest checkpoints kept on disk

  def check(self) -> None:
    require_non_negative(self, "checkpoint_every_seconds", "checkpoint_every_steps")
    if self.keep_checkpoints < 1:
      raise ConfigError("keep_checkpoints", f"must be >= 1, got {self.keep_checkpoints}")


@settings_group("distributed", "the distributed program (--distributed)", modes={DISTRIBUTED}, field_modes={
    "distributed": FieldModes(EVERY_MODE, "it chooses the mode"),
})
@dataclasses.dataclass(frozen=True)
class DistributedSettings(Settings):
  """The distributed program's nodes: actors, inference, restarts, and the engine that runs them
  (distributed runs)."""
  distributed: bool = False          # run as a distributed program (actors, replay, learner, ...) instead of one process
  engine: str = ""                   # what runs the program's nodes: 'launchpad' (the full stack) or 'ray'; empty:
                                     # launchpad where it is installed, else ray
  num_actors: int = 4                # actor nodes, each stepping num_envs envs
  inference: str = "actor"           # where the policy runs: 'actor' (IMPALA-style) or 'server' (SEED-style)
  num_inference_servers: int = 1     # central batched inference servers (inference=server)
  inference_timeout_ms: float = 10.0  # longest a server waits for every actor to ask before answering
  variable_update_period: int = 10   # actor/server steps between parameter refreshes (distributed)
  lp_launch_type: str = "local_mp"   # Launchpad launch type: local_mp or local_mt
  max_restarts: int = 3              # restarts allowed per actor, evaluator or inference node
  restart_backoff_seconds: float = 1.0  # first wait before a restart; doubles with each restart of a node
  service_deadline_seconds: float = 60.0  # how long actors retry a lost replay or inference server
  ray_address: str = ""              # --engine ray: the Ray cluster to join (host:port, as `ray start --head` says);
                                     # empty: a Ray of this run's own on this host

  def check(self) -> None:
    require_positive(self, "num_actors", "num_inference_servers", "variable_update_period")
    if self.engine not in ("", "launchpad", "ray"):
      raise ConfigError("engine", f"must be 'launchpad' or 'ray', got '{self.engine}'")
    if self.ray_address and self.engine == "launchpad":
      raise ConfigError("ray_address", "joins a Ray cluster: it needs --engine ray, not launchpad")
    if self.inference not in ("actor", "server"):
      raise ConfigError("inference", f"must be 'actor' or 'server', got '{self.inference}'")
    if self.lp_launch_type not in ("local_mp", "local_mt"):
      raise ConfigError("lp_launch_type", f"must be 'local_mp' or 'local_mt', got '{self.lp_launch_type}'")
    require_positive(self, "inference_timeout_ms")
    require_non_negative(self, "max_restarts", "restart_backoff_seconds")
    require_positive(self, "service_deadline_seconds")


@settings_group("launcher", "where a run's processes go (--launcher slurm / template)",
       modes={DISTRIBUTED, DEVICE_HOSTS}, field_modes={
           "launcher": FieldModes(EVERY_MODE - {EMBEDDED}, "it puts a distributed or device run on hosts"),
       })
@dataclasses.dataclass(frozen=True)
class LauncherSettings(Settings):
  """Where a run's processes go: this host, Slurm's hosts or a template's (distributed runs and
  device runs over hosts)."""
  launcher: str = "local"            # where the program runs: 'local' (this host), 'slurm', or 'template' (host_command)
  hosts: str = ""                    # multi-host: "node1,node2,node3" (Slurm gives addresses) or "node1=10.0.0.1,..."
  placement: str = ""                # multi-host: groups on hosts, e.g. "replay,learner,counter,evaluator=node1 actor=node2,node3"
  host_command: str = ""             # template launcher: runs {command} on {host} at {address}, e.g. "ssh {host} {command}"
  host_deadline_seconds: float = 30.0  # multi-host: a host agent silent this long is lost (its actors: the run
                                       # goes on; a learner, replay, counter, evaluator or server: it stops)

  def check(self) -> None:
    if self.launcher not in ("local", "slurm", "template"):
      raise ConfigError("launcher", f"must be 'local', 'slurm' or 'template', got '{self.launcher}'")
    if self.launcher != "local" and not self.hosts:
      raise ConfigError("hosts", f"--launcher {self.launcher} needs the hosts, e.g. --hosts node1,node2,node3")
    if self.launcher == "template" and "{command}" not in self.host_command:
      raise ConfigError("host_command", "needs a template with {command} (and {host} or {address}), "
                                        "e.g. 'ssh {host} {command}'")
    require_positive(self, "host_deadline_seconds")


@settings_group("device", "the on-device loop")
@dataclasses.dataclass(frozen=True)
class DeviceSettings(Settings):
  """Which backend steps the envs: Python envs on the host, or gymnax envs in one compiled loop
  (every mode: it chooses between them)."""
  backend: str = "host"              # 'host': Python envs, embedded or distributed; 'device': gymnax envs, one compiled loop

  def check(self) -> None:
    if self.backend not in ("host", "device"):
      raise ConfigError("backend", f"must be 'host' or 'device', got '{self.backend}'")


GROUPS: Tuple[Group, ...] = tuple(_GROUPS)
# The experiment's fields by concern: `--help` shows one heading per group, in this order
# ((name, description, field names); docs/hooks.py makes the docs' table from it too).
FIELD_GROUPS = tuple((entry.name, entry.description, entry.fields()) for entry in GROUPS)
# Each field's group, by field name: the groups' own fields, so it cannot drift from them.
GROUP_OF: Dict[str, Group] = {name: entry for entry in GROUPS for name in entry.fields()}


def mode_of(distributed: bool, backend: str) -> str:
  """The mode of a run: 'device' for --backend device, else 'distributed' or 'embedded'."""
  if backend == "device":
    return DEVICE
  return DISTRIBUTED if distributed else EMBEDDED


def _listed(words) -> str:
  return ", ".join(words[:-1]) + " and " + words[-1] if len(words) > 1 else words[0]


class WrongModeError(ConfigError):
  """A field given for a run whose mode does not use it; the message names the field and its group."""

  def __init__(self, field: str, group_name: str, message: str):
    super().__init__(field, message)
    self.group = group_name

  def __str__(self) -> str:
    return self.problem


# Every group at once: the groups' fields, flat (dataclass fields come from the bases last to first, so
# the run group's come first). Its own body declares no field (checked below).
@dataclasses.dataclass(frozen=True)
class ExperimentConfig(DeviceSettings, LauncherSettings, DistributedSettings, CheckpointSettings, LearnerSettings,
                       RunSettings):
  """Settings shared by every agent; the agent's own live in its Config."""

  def check(self) -> None:
    """Every group's checks, and those across groups (Settings.__post_init__ runs it)."""
    self._check_mode()
    for entry in GROUPS:
      entry.cls.check(self)
    # Checks across groups.
    if self.env_groups > 1 and self.inference == "server":
      raise ConfigError("env_groups", "groups take turns with the policy in the actor; with --inference server "
                                      "the server batches the actors' requests instead (use --env_groups 1)")
    if self.env_groups > 1 and self.mode == DEVICE:
      raise ConfigError("env_groups", "applies to the host backend's Python envs, not to --backend device")
    if self.actor_device != "auto" and self.mode == DEVICE:
      raise ConfigError("actor_device", "applies to the host backend; --backend device acts inside its compiled loop")
    if self.num_processes > 1 and not self.coordinator_address and self.scope in (EMBEDDED, DEVICE):
      raise ConfigError("coordinator_address", "is required when num_processes > 1 (a distributed program picks one)")

  def _check_mode(self) -> None:
    """ConfigError for mode flags that contradict each other (before the groups' own checks, so the
    mode named is the one asked for)."""
    if self.backend == "device" and self.distributed:
      raise ConfigError("backend", "'device' is one compiled loop, not a Launchpad program: drop --distributed "
                                   "(over several hosts: --launcher slurm or template)")
    if self.launcher in ("slurm", "template") and self.mode == EMBEDDED:
      raise ConfigError("launcher", f"'{self.launcher}' launches a distributed program or a device run over "
                                    "hosts: add --distributed or --backend device")

  @property
  def mode(self) -> str:
    """'embedded', 'distributed' or 'device': which driver runs this experiment."""
    return mode_of(self.distributed, self.backend)

  @property
  def over_hosts(self) -> bool:
    """Whether a launcher (Slurm, a template) puts the run's processes on hosts."""
    return self.launcher != "local"

  @property
  def scope(self) -> str:
    """The mode the groups' fields are checked against: `mode`, or 'device over hosts' for a
    device run a launcher puts on hosts."""
    return DEVICE_HOSTS if self.mode == DEVICE and self.over_hosts else self.mode

  def settings(self, which: Union[str, Type]) -> Settings:
    """One group's fields as its dataclass (a group name, "distributed", or its class); made, so checked."""
    entry = next((g for g in GROUPS if which in (g.name, g.cls)), None)
    if entry is None:
      raise KeyError(f"no settings group {which!r} (groups: {', '.join(g.name for g in GROUPS)})")
    return entry.cls(**{name: getattr(self, name) for name in entry.fields()})

  def uses(self, name: str) -> bool:
    """Whether this run's mode uses the field `name`."""
    return self.scope in GROUP_OF[name].modes_of(name)

  def check_field_mode(self, name: str) -> None:
    """WrongModeError when this run's mode does not use the field `name`, naming its group and the
    flag that would make it apply."""
    if self.uses(name):
      return
    entry = GROUP_OF[name]
    modes = entry.modes_of(name)
    heading = entry.description.split(" (")[0]
    switches = [_SWITCH[(self.scope, mode)] for mode in MODES if mode in modes and (self.scope, mode) in _SWITCH]
    switch = sorted(switches, key=lambda text: not text.startswith("add"))[0]  # adding a flag first
    if name in entry.field_modes:
      uses = _listed([mode for mode in MODES if mode in modes])
      message = (f"--{name} of the '{entry.name}' settings applies to {uses} runs, not to "
                 f"{_A_RUN[self.scope]} ({entry.field_modes[name].why}): {switch} or drop it")
    else:
      message = (f"--{name} belongs to the '{entry.name}' settings ({heading}), which {_A_RUN[self.scope]} "
                 f"does not use: {switch} or drop it")
    raise WrongModeError(name, entry.name, message)

  def check_given_flags(self, given) -> None:
    """WrongModeError for a field given explicitly that this run's mode does not use
    (`given`: names of the fields set on the command line)."""
    for name in given:
      self.check_field_mode(name)

  def default_run_dir(self) -> str:
    return "runs/" + path_safe(f"{self.agent}-{self.env}-s{self.seed}-{time.strftime('%Y%m%d-%H%M%S')}")


if set(vars(ExperimentConfig).get("__annotations__", {})) or sorted(GROUP_OF) != sorted(
    f.name for f in dataclasses.fields(ExperimentConfig)):
  raise TypeError("ExperimentConfig's fields are its groups' fields: declare a new one in its group's dataclass")
