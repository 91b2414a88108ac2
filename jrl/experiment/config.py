"""Experiment configuration: what to run, for how long, and where results go."""

import dataclasses
import time
from typing import Optional

from jrl.errors import ConfigError, require_non_negative, require_positive
from jrl.experiment.files import path_safe


# Fields one mode of run cannot honour; given explicitly in the other mode they are an error.
EMBEDDED_ONLY = {
    "deterministic": "Reverb's samplers cannot be seeded, so a distributed run is not bit-reproducible",
    "log_every": "distributed nodes write a metrics row every second",
    "process_id": "a distributed program numbers its learner processes itself",
    "actor_device": "actor nodes run on the CPU (jrl.accelerators); --inference server batches them on a GPU",
}
DISTRIBUTED_ONLY = frozenset({
    "num_actors", "inference", "num_inference_servers", "inference_timeout_ms", "variable_update_period",
    "lp_launch_type", "launcher", "hosts", "placement", "host_command", "host_deadline_seconds", "max_restarts",
    "restart_backoff_seconds",
    "service_deadline_seconds",
})

# Where a run's processes go: a device run over several hosts takes them too (launch.device_hosts).
HOST_FIELDS = frozenset({"launcher", "hosts", "placement", "host_command", "host_deadline_seconds"})


# The experiment's fields by concern: `--help` shows one heading per group, in this order.
FIELD_GROUPS = (
    ("run", "what to train, for how long, evaluation and logging",
     ("agent", "env", "seed", "steps", "run_dir", "preset", "deterministic", "num_envs", "env_groups", "actor_device",
      "eval_every", "eval_episodes", "stop_at_threshold", "reward_threshold", "log_every", "progress_seconds")),
    ("learner", "updates, devices and the batch pipeline",
     ("updates_per_call", "learner_devices", "coordinator_address", "num_processes", "process_id", "prefetch")),
    ("checkpoints", "checkpoints and resume",
     ("resume", "resume_strict", "checkpoint_every_seconds", "checkpoint_every_steps", "keep_checkpoints")),
    ("distributed", "the Launchpad program (--distributed)",
     ("distributed", "num_actors", "inference", "num_inference_servers", "inference_timeout_ms",
      "variable_update_period", "lp_launch_type", "max_restarts", "restart_backoff_seconds",
      "service_deadline_seconds")),
    ("launcher", "where a distributed program runs (--launcher slurm / template)",
     ("launcher", "hosts", "placement", "host_command", "host_deadline_seconds")),
    ("device", "the on-device loop", ("backend",)),
)


@dataclasses.dataclass(frozen=True)
class ExperimentConfig:
  """Settings shared by every agent; the agent's own live in its Config."""
  agent: str = "dqn"                 # agent name (jrl.agents.AGENTS), or a module pkg.module with the five pieces
  env: str = "CartPole-v1"           # gymnasium environment id, or pkg.module:function returning a gymnasium env
  seed: int = 0                      # seeds envs, networks, policies and replay sampling
  steps: int = 50_000                # env-step budget of the actors
  run_dir: str = ""                  # results folder; empty means runs/<agent>-<env>-s<seed>-<time>
  preset: str = ""                   # a named set of the agent's hyperparameters (--list_presets), applied before
                                     # the other flags, which win
  deterministic: bool = False        # seeded in-process replay instead of Reverb: same seed, same bytes
  backend: str = "host"              # 'host': Python envs, embedded or distributed; 'device': gymnax envs, one compiled loop
  num_envs: int = 8                  # envs stepped together by the actor
  env_groups: int = 1                # the actor's envs step as this many groups in turn, each group's next
                                     # actions computed while the others step (2: halves; pays for CNNs)
  actor_device: str = "auto"         # where an embedded run's policy acts: 'cpu', 'accelerator' (the learner's
                                     # first device), or 'auto': by the policy's FLOPs per step (jrl.accelerators)
  updates_per_call: int = 4          # SGD updates per jitted learner call (lax.scan)
  learner_devices: int = 0           # devices of the learner's data-parallel mesh; 0 = all
  coordinator_address: str = ""      # host:port of process 0, to span the learner mesh over processes
  num_processes: int = 1             # learner processes joined through jax.distributed
  process_id: int = 0                # this process's index among num_processes
  prefetch: int = 2                  # learner batches prepared ahead (Reverb runs)
  eval_every: int = 2_500            # env steps between evaluations
  eval_episodes: int = 10            # greedy episodes per evaluation
  stop_at_threshold: bool = False    # end the run once eval reaches the reward threshold
  reward_threshold: Optional[float] = None  # success threshold; None takes the env's gymnasium spec
  log_every: int = 1_000             # env steps between metric rows
  progress_seconds: float = 2.0      # seconds between progress lines; 0 silences them
  # Checkpoints and resume.
  resume: str = ""                   # run directory to continue from its newest intact checkpoint
  resume_strict: bool = False        # refuse to resume when the newest checkpoint is damaged; without it the run
                                     # continues from the newest intact one (damaged ones: checkpoints/damaged/)
  checkpoint_every_seconds: float = 600.0  # wall seconds between checkpoints; 0 = not by time
  checkpoint_every_steps: int = 0    # env steps between checkpoints; 0 = not by steps
  keep_checkpoints: int = 3          # newest checkpoints kept on disk
  # Distributed (Launchpad) runs.
  distributed: bool = False          # run as a Launchpad program instead of one process
  num_actors: int = 4                # actor nodes, each stepping num_envs envs
  inference: str = "actor"           # where the policy runs: 'actor' (IMPALA-style) or 'server' (SEED-style)
  num_inference_servers: int = 1     # central batched inference servers (inference=server)
  inference_timeout_ms: float = 10.0  # longest a server waits for every actor to ask before answering
  variable_update_period: int = 10   # actor/server steps between parameter refreshes (distributed)
  lp_launch_type: str = "local_mp"   # Launchpad launch type: local_mp or local_mt
  launcher: str = "local"            # where the program runs: 'local' (this host), 'slurm', or 'template' (host_command)
  hosts: str = ""                    # multi-host: "node1,node2,node3" (Slurm gives addresses) or "node1=10.0.0.1,..."
  placement: str = ""                # multi-host: groups on hosts, e.g. "replay,learner,counter,evaluator=node1 actor=node2,node3"
  host_command: str = ""             # template launcher: runs {command} on {host} at {address}, e.g. "ssh {host} {command}"
  host_deadline_seconds: float = 30.0  # multi-host: a host agent silent this long is lost (its actors: the run
                                       # goes on; a learner, replay, counter, evaluator or server: it stops)
  max_restarts: int = 3              # restarts allowed per actor, evaluator or inference node
  restart_backoff_seconds: float = 1.0  # first wait before a restart; doubles with each restart of a node
  service_deadline_seconds: float = 60.0  # how long actors retry a lost replay or inference server

  def __post_init__(self):
    require_positive(self, "steps", "num_envs", "updates_per_call", "prefetch", "eval_every", "eval_episodes",
                     "log_every", "num_actors", "num_inference_servers", "variable_update_period")
    if self.env_groups < 1 or self.num_envs % self.env_groups:
      raise ConfigError("env_groups", f"must be >= 1 and divide num_envs={self.num_envs}, got {self.env_groups}")
    if self.env_groups > 1 and self.inference == "server":
      raise ConfigError("env_groups", "groups take turns with the policy in the actor; with --inference server "
                                      "the server batches the actors' requests instead (use --env_groups 1)")
    if self.env_groups > 1 and self.backend == "device":
      raise ConfigError("env_groups", "applies to the host backend's Python envs, not to --backend device")
    if self.actor_device not in ("auto", "cpu", "accelerator"):
      raise ConfigError("actor_device", f"must be 'auto', 'cpu' or 'accelerator', got '{self.actor_device}'")
    if self.actor_device != "auto" and self.backend == "device":
      raise ConfigError("actor_device", "applies to the host backend; --backend device acts inside its compiled loop")
    if self.backend not in ("host", "device"):
      raise ConfigError("backend", f"must be 'host' or 'device', got '{self.backend}'")
    if self.backend == "device" and self.distributed:
      raise ConfigError("backend", "'device' is one compiled loop, not a Launchpad program: drop --distributed "
                                   "(over several hosts: --launcher slurm or template)")
    if self.inference not in ("actor", "server"):
      raise ConfigError("inference", f"must be 'actor' or 'server', got '{self.inference}'")
    if self.launcher not in ("local", "slurm", "template"):
      raise ConfigError("launcher", f"must be 'local', 'slurm' or 'template', got '{self.launcher}'")
    if self.launcher != "local" and not self.distributed and self.backend != "device":
      raise ConfigError("launcher", f"'{self.launcher}' launches a distributed program or a device run over "
                                    "hosts: add --distributed or --backend device")
    if self.launcher != "local" and not self.hosts:
      raise ConfigError("hosts", f"--launcher {self.launcher} needs the hosts, e.g. --hosts node1,node2,node3")
    if self.launcher == "template" and "{command}" not in self.host_command:
      raise ConfigError("host_command", "needs a template with {command} (and {host} or {address}), "
                                        "e.g. 'ssh {host} {command}'")
    if self.lp_launch_type not in ("local_mp", "local_mt"):
      raise ConfigError("lp_launch_type", f"must be 'local_mp' or 'local_mt', got '{self.lp_launch_type}'")
    require_positive(self, "inference_timeout_ms")
    if self.learner_devices < 0:
      raise ConfigError("learner_devices", f"must be >= 0 (0 = all), got {self.learner_devices}")
    if not 0 <= self.process_id < self.num_processes:
      raise ConfigError("process_id", f"must be in [0, num_processes={self.num_processes}), got {self.process_id}")
    if (self.num_processes > 1 and not self.coordinator_address and not self.distributed
        and not (self.backend == "device" and self.launcher != "local")):
      raise ConfigError("coordinator_address", "is required when num_processes > 1 (a distributed program picks one)")
    require_non_negative(self, "checkpoint_every_seconds", "checkpoint_every_steps", "max_restarts",
                         "restart_backoff_seconds")
    if self.keep_checkpoints < 1:
      raise ConfigError("keep_checkpoints", f"must be >= 1, got {self.keep_checkpoints}")
    require_positive(self, "service_deadline_seconds", "host_deadline_seconds")
    require_non_negative(self, "progress_seconds")

  def check_given_flags(self, given) -> None:
    """ConfigError for a field given explicitly that this run's mode cannot honour
    (`given`: names of the fields set on the command line)."""
    for name in given:
      if self.distributed and name in EMBEDDED_ONLY:
        raise ConfigError(name, f"applies to runs in one process, not to --distributed ones ({EMBEDDED_ONLY[name]})")
      if not self.distributed and name in DISTRIBUTED_ONLY and not (self.backend == "device" and name in HOST_FIELDS):
        raise ConfigError(name, "applies to --distributed runs only")

  def default_run_dir(self) -> str:
    return "runs/" + path_safe(f"{self.agent}-{self.env}-s{self.seed}-{time.strftime('%Y%m%d-%H%M%S')}")
