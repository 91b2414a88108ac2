"""Launching a placed program on several hosts: through Slurm, or a command template per host.

`--launcher slurm` writes `RUN_DIR/launch/job.sbatch` (one job, one step per
host running `python -m launch.host RUN_DIR HOST`; readable, and reusable by
hand with `sbatch`), submits it, follows the job while echoing the evaluator's
progress, and returns the program's exit status. Ctrl-C cancels the job.
`--launcher template` runs the same host command through `--host_command`
(e.g. `ssh {host} {command}`) for users without Slurm.

GPUs: the hosts the placement gives the learner, the inference servers or a device run's
processes are the GPU hosts (`gpu_requests`). Slurm is asked for GPUs only on hosts whose node
has GPUs in its Gres (`scontrol show node`; a cluster without them is asked for none): the job is
then a heterogeneous one, the GPU hosts' component with `--gres=gpu:N`. The template launcher
fills `{gpus}` in --host_command with the GPUs a host's nodes take (0 on the others), e.g.
`srun -w {host} --gres=gpu:{gpus} {command}`; a template without it is unchanged.
"""

import glob
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from jrl.errors import ConfigError
from jrl.experiment.files import SUMMARY_FILE
from jrl.run.distributed import liveness, multihost
from jrl.run.distributed.placement import Host, Placement, default_placement, parse_hosts, parse_placement

POLL_SECONDS = 0.5
EXIT_STATUS_FILE = multihost.EXIT_STATUS_FILE
# How long the launcher waits for the job (or the host commands) to end once the program has
# stopped, before it ends them itself.
STOP_GRACE_SECONDS = 30.0
# What --launcher slurm runs: node addresses, the job's submission, its state, its cancellation.
SLURM_COMMANDS = ("scontrol", "sbatch", "squeue", "scancel")


def host_agent_command(run_dir: str, host: str) -> List[str]:
  return [sys.executable, "-m", "launch.host", run_dir, host]


def slurm_node(name: str) -> Tuple[Dict[str, str], str]:
  """A Slurm node's fields from `scontrol show node` ({} when Slurm does not know it) and scontrol's message."""
  out = subprocess.run(["scontrol", "show", "node", name], capture_output=True, text=True)
  fields = dict(part.split("=", 1) for part in out.stdout.split() if "=" in part)
  return (fields if out.returncode == 0 else {}), (out.stderr or out.stdout).strip()


def slurm_addresses(names) -> Dict[str, str]:
  """NodeAddr of each Slurm node, from `scontrol show node`."""
  addresses = {}
  for name in names:
    fields, message = slurm_node(name)
    if "NodeAddr" not in fields:
      raise RuntimeError(f"Slurm does not know host '{name}': {message}")
    addresses[name] = fields["NodeAddr"]
  return addresses


# The roles that run on GPUs (jrl.accelerators.ACCELERATOR_ROLES and a device run's processes).
GPU_GROUPS = ("learner", "inference", "device")


def slurm_gres_gpus(gres: str) -> int:
  """The GPUs in a Slurm node's Gres field ('gpu:4', 'gpu:a100:2(S:0-1),shard:8', '(null)' -> 0)."""
  total = 0
  for item in gres.split(","):
    parts = item.split("(")[0].split(":")
    if parts[0] == "gpu" and len(parts) > 1 and parts[-1].isdigit():
      total += int(parts[-1])
  return total


def slurm_gpus(names) -> Dict[str, int]:
  """GPUs of each Slurm node (its Gres, `scontrol show node`); 0 where Slurm does not say."""
  return {name: slurm_gres_gpus(slurm_node(name)[0].get("Gres", "")) for name in names}


def gpu_requests(exp, placement: Placement, host_gpus: Optional[Dict[str, int]] = None,
                 jax_platforms: Optional[str] = None) -> Dict[str, int]:
  """host -> the GPUs its nodes take: each learner or device process --learner_devices of them (at least
  one), each inference server one; 0 on hosts with none of these. `host_gpus` (Slurm: the nodes' Gres)
  caps it: a host with none is asked for none (a CPU cluster), --learner_devices 0 takes all of a
  host's, and more --learner_devices than a host has is a ConfigError. JAX_PLATFORMS=cpu (default: the
  launcher's environment): none anywhere."""
  platforms = os.environ.get("JAX_PLATFORMS", "") if jax_platforms is None else jax_platforms
  if platforms.split(",")[0].strip().lower() == "cpu":
    return {h.name: 0 for h in placement.hosts}
  counts = {"device": exp.num_processes} if exp.backend == "device" else group_counts(exp)
  requests = {}
  for host in placement.hosts:
    on_host = placement.nodes_on(host.name, counts)
    learners = sum(group in ("learner", "device") for group, _ in on_host)
    servers = sum(group == "inference" for group, _ in on_host)
    if host_gpus is None:
      requests[host.name] = learners * max(1, exp.learner_devices) + servers
      continue
    have = host_gpus.get(host.name, 0)
    if not have or not (learners or servers):
      requests[host.name] = 0
      continue
    if learners * exp.learner_devices > have:
      raise ConfigError("learner_devices", f"host {host.name} has {have} GPUs (Slurm's Gres) for {learners} learner "
                                           f"process(es) of {exp.learner_devices} devices each")
    requests[host.name] = have if learners and not exp.learner_devices else min(
        have, learners * exp.learner_devices + servers)
  return requests


def sbatch_lines(run_dir: str, hosts: Tuple[Host, ...], job_name: str, cwd: str,
                 gpus: Optional[Dict[str, int]] = None) -> List[str]:
  """The job script's lines. Without GPUs: one job over the hosts, a step per host. With GPUs on some
  hosts (`gpus`: host -> GPUs): a heterogeneous job, one component per GPU count (--gres=gpu:N where N >
  0), each host's step in its component (srun --het-group) with its GPUs."""
  folder = multihost.launch_dir(run_dir)
  gpus = {h.name: (gpus or {}).get(h.name, 0) for h in hosts}
  components: Dict[int, List[Host]] = {}
  for host in hosts:
    components.setdefault(gpus[host.name], []).append(host)
  heterogeneous = any(gpus.values())
  lines = ["#!/bin/bash", f"#SBATCH --job-name={job_name}"]
  for i, (count, members) in enumerate(components.items()):
    if i:
      lines.append("#SBATCH hetjob")
    lines += [f"#SBATCH --nodes={len(members)}", f"#SBATCH --nodelist={','.join(h.name for h in members)}",
              "#SBATCH --ntasks-per-node=1"]
    if count:
      lines.append(f"#SBATCH --gres=gpu:{count}")
    if not i:
      lines.append(f"#SBATCH --output={os.path.join(folder, 'slurm-%j.out')}")
  lines += [f"# jrl program of {run_dir}: one step per host, each running that host's nodes.",
            f"cd {shlex.quote(cwd)}", "pids=()"]
  component_of = {h.name: i for i, members in enumerate(components.values()) for h in members}
  for host in hosts:
    command = " ".join(shlex.quote(p) for p in host_agent_command(run_dir, host.name))
    group = f"--het-group={component_of[host.name]} " if heterogeneous else ""
    gres = f"--gres=gpu:{gpus[host.name]} " if gpus[host.name] else ""
    lines.append(f"srun {group}--exclusive -N1 -n1 -w {host.name} {gres}{command} &")
    lines.append("pids+=($!)")
  lines += [
      "status=0",
      'for pid in "${pids[@]}"; do wait "$pid" || { s=$?; [ "$status" -eq 0 ] && status=$s; }; done',
      f"echo $status > {shlex.quote(os.path.join(folder, EXIT_STATUS_FILE))}",
      "exit $status",
  ]
  return lines


def sbatch_script(run_dir: str, hosts: Tuple[Host, ...], job_name: str, gpus: Optional[Dict[str, int]] = None) -> str:
  """Writes `sbatch_lines` to RUN_DIR/launch/job.sbatch; returns its path."""
  path = os.path.join(multihost.launch_dir(run_dir), "job.sbatch")
  with open(path, "w") as f:
    f.write("\n".join(sbatch_lines(run_dir, hosts, job_name, os.getcwd(), gpus)) + "\n")
  return path


# A job waiting for its hosts: their agents have not started.
WAITING_STATES = ("PENDING", "CONFIGURING")
# How long the launcher keeps asking when squeue fails (the controller busy or restarting) before
# it gives the job up as unknown.
SQUEUE_RETRY_SECONDS = 300.0


def _job_state(job_id: str) -> Tuple[Optional[str], str]:
  """(the job's state, '' once it has ended; None when squeue could not say, with its error)."""
  out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True)
  if out.returncode != 0 and "Invalid job id" not in out.stderr:  # (an ended job the controller forgot)
    lines = out.stderr.strip().splitlines()
    return None, lines[-1] if lines else f"squeue exited {out.returncode}"
  return out.stdout.strip(), ""


class _StuckWatch:
  """When the program has stopped (its stop file) but the job or host commands have not ended, they
  are ended by force: at once when only lost hosts are left (a lost host's step waits on Slurm's
  own node timeout, minutes; a template command on a dead host may never return), otherwise after
  STOP_GRACE_SECONDS."""

  def __init__(self, run_dir: str, watch: liveness.HostWatch):
    self._stop_file, self._watch, self._since = multihost.stop_path(run_dir), watch, None

  def stuck(self) -> str:
    """Why the job should be ended now; '' while it should not."""
    if not os.path.exists(self._stop_file):
      return ""
    if self._since is None:
      self._since = time.monotonic()
    if self._watch.lost and self._watch.others_ended():
      return f"has only its lost hosts ({', '.join(sorted(self._watch.lost))}) left"
    if time.monotonic() - self._since >= STOP_GRACE_SECONDS:
      lost = f" (lost: {liveness.describe_lost(self._watch.lost)})" if self._watch.lost else ""
      return f"is still running {STOP_GRACE_SECONDS:.0f}s after the program stopped{lost}"
    return ""


def run_slurm(run_dir: str, hosts: Tuple[Host, ...], job_name: str, watch: liveness.HostWatch,
              gpus: Optional[Dict[str, int]] = None) -> int:
  script = sbatch_script(run_dir, hosts, job_name, gpus)
  try:
    out = subprocess.run(["sbatch", "--parsable", script], capture_output=True, text=True)
  except FileNotFoundError:
    raise RuntimeError("sbatch not found: --launcher slurm needs Slurm's client commands on PATH") from None
  if out.returncode != 0:
    raise RuntimeError(f"sbatch refused {script}: {out.stderr.strip()}")
  job_id = out.stdout.strip().split(";")[0]
  print(f"[slurm] submitted job {job_id} ({len(hosts)} hosts): {script}", flush=True)
  status_file = os.path.join(multihost.launch_dir(run_dir), EXIT_STATUS_FILE)
  stuck = _StuckWatch(run_dir, watch)
  try:
    state, unanswered_since = "", None
    while True:
      current, error = _job_state(job_id)
      if current is None:  # squeue failed: the job's state is unknown, not ended
        if unanswered_since is None:
          unanswered_since = time.monotonic()
          print(f"[slurm] squeue failed ({error}); asking again", flush=True)
        elif time.monotonic() - unanswered_since > SQUEUE_RETRY_SECONDS:
          print(f"[slurm] squeue failed for {SQUEUE_RETRY_SECONDS:.0f}s ({error}): giving job {job_id} up",
                flush=True)
          break
      else:
        unanswered_since = None
        if current != state and current:
          print(f"[slurm] job {job_id} {current.lower()}", flush=True)
        state = current
        if not state:
          break
        if state not in WAITING_STATES:
          watch.start()  # its hosts' agents are starting: from now a silent host counts
      watch.poll()
      why = stuck.stuck()
      if why:
        print(f"[slurm] job {job_id} {why}: cancelling it", flush=True)
        subprocess.run(["scancel", job_id], capture_output=True)
        break
      time.sleep(POLL_SECONDS)
  except KeyboardInterrupt:
    print(f"[slurm] interrupted: cancelling job {job_id}", flush=True)
    multihost.RequestStop(multihost.stop_path(run_dir))()
    subprocess.run(["scancel", job_id])
    while _job_state(job_id)[0]:  # (or squeue cannot say)
      time.sleep(POLL_SECONDS)
    raise
  if not os.path.exists(status_file):
    return 1  # cancelled or killed before the script could record its status
  with open(status_file) as f:
    return int(f.read().strip() or 1)


def template_line(template: str, run_dir: str, host: Host, gpus: int = 0) -> str:
  """--host_command for one host: {host}, {address}, {command} (its host agent) and {gpus} (the GPUs its
  nodes take, `gpu_requests`) filled in."""
  command = " ".join(shlex.quote(p) for p in host_agent_command(run_dir, host.name))
  return template.format(host=host.name, address=host.address, command=command, gpus=gpus)


def run_template(run_dir: str, hosts: Tuple[Host, ...], template: str, watch: liveness.HostWatch,
                 gpus: Optional[Dict[str, int]] = None) -> int:
  procs = []
  for host in hosts:
    line = template_line(template, run_dir, host, (gpus or {}).get(host.name, 0))
    log = open(os.path.join(multihost.launch_dir(run_dir), f"host-{host.name}.out"), "w")
    procs.append((subprocess.Popen(line, shell=True, stdout=log, stderr=subprocess.STDOUT, start_new_session=True),
                  log))
    print(f"[template] {host.name}: {line}", flush=True)
  watch.start()
  stuck = _StuckWatch(run_dir, watch)
  try:
    while any(p.poll() is None for p, _ in procs):
      watch.poll()
      why = stuck.stuck()
      if why:
        names = [h.name for h, (p, _) in zip(hosts, procs) if p.poll() is None]
        print(f"[template] the job {why}: ending the commands of {', '.join(names)}", flush=True)
        for p, _ in procs:
          if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        break
      time.sleep(POLL_SECONDS)
  except KeyboardInterrupt:
    multihost.RequestStop(multihost.stop_path(run_dir))()
    for p, _ in procs:
      p.wait()
    raise
  finally:
    for _, log in procs:
      log.close()
  codes = [p.returncode for p, _ in procs]
  return next((c for c in codes if c), 0)


def group_counts(exp) -> Dict[str, int]:
  """Nodes per group of the program `exp` describes."""
  return {"counter": 1, "replay": 1, "learner": exp.num_processes, "evaluator": 1, "actor": exp.num_actors,
          "inference": exp.num_inference_servers if exp.inference == "server" else 0}


def resolve_placement(exp) -> Placement:
  """Hosts with their addresses and the validated placement; ConfigError naming the field."""
  hosts = resolve_hosts(exp)
  return parse_placement(exp.placement or default_placement(hosts), hosts, group_counts(exp))


def require_slurm() -> None:
  """ConfigError('launcher') naming Slurm's commands this host lacks: checked before anything is
  written, so a machine without Slurm hears so in one line, not as a missing file mid-launch."""
  missing = [command for command in SLURM_COMMANDS if shutil.which(command) is None]
  if missing:
    raise ConfigError("launcher", f"Slurm's commands ({', '.join(missing)}) are not installed here: --launcher slurm "
                                  "needs a Slurm cluster (without one: --launcher template --host_command "
                                  "'ssh {host} {command}')")


def resolve_hosts(exp) -> Tuple[Host, ...]:
  """`--hosts` with every host's address (Slurm's NodeAddr where not given); ConfigError."""
  hosts = parse_hosts(exp.hosts)
  if exp.launcher == "slurm":
    require_slurm()
    missing = [h.name for h in hosts if not h.address]
    try:
      found = slurm_addresses(missing) if missing else {}
    except (OSError, RuntimeError) as e:
      raise ConfigError("hosts", f"cannot resolve through Slurm: {e}") from None
    hosts = tuple(Host(h.name, h.address or found[h.name]) for h in hosts)
  for host in hosts:
    if not host.address:
      raise ConfigError("hosts", f"host '{host.name}' has no address: give it as {host.name}=IP")
  return hosts


def failure_report(run_dir: str) -> str:
  """What the host agents wrote about the node that failed (services blamed first)."""
  reports = []
  for path in sorted(glob.glob(multihost.failure_path(run_dir, "*"))):
    with open(path) as f:
      reports.append(f"on host {os.path.basename(path)[len('failure-'):-len('.txt')]}: {f.read().strip()}")
  return "\n".join(reports) or f"the job ended with an error; see {multihost.launch_dir(run_dir)}"


def last_checkpoint_line(run_dir: str) -> str:
  """How a failure report names the checkpoint a resume continues from."""
  from jrl.experiment.checkpoint import describe_latest
  latest = describe_latest(run_dir)
  return f"The run's last checkpoint is {latest}" if latest else "The run has no checkpoint yet"


def hosts_flag(exp, hosts: Sequence[Host]) -> str:
  """`--hosts` for these hosts in a printed command: names (Slurm resolves them) or, for the
  template launcher, name=address pairs."""
  return ",".join(f"{h.name}={h.address}" if exp.launcher == "template" else h.name for h in hosts)


def resume_hint(exp, placement: Placement, run_dir: str):
  """The line a lost host's report ends with: the last checkpoint, and the command that continues
  the run on the other hosts."""
  def hint(lost: Sequence[str]) -> str:
    _, groups = liveness.placement_without([h.name for h in placement.hosts], placement.groups, lost)
    hosts = hosts_flag(exp, [h for h in placement.hosts if h.name not in lost])
    return (f"{last_checkpoint_line(run_dir)}; continue it on the other hosts with: python -m launch.train "
            f"--resume {run_dir} --hosts {hosts} --placement '{groups}'")
  return hint


def host_gpu_requests(exp, placement: Placement) -> Dict[str, int]:
  """`gpu_requests` for this launch: Slurm's nodes' Gres caps it; the template launcher's {gpus}."""
  host_gpus = slurm_gpus([h.name for h in placement.hosts]) if exp.launcher == "slurm" else None
  return gpu_requests(exp, placement, host_gpus)


def launch_on_hosts(exp, program, run_dir: str, placement: Placement, restart) -> Dict[str, Any]:
  """Runs the placed program until it ends; RuntimeError with the failure report if it failed.
  Returns the hosts lost during the run that it could do without (liveness.read_lost's form).
  The hosts given GPUs (`host_gpu_requests`; Slurm: only nodes that have them) start each node with
  its role's devices (multihost.build_plan)."""
  gpus = host_gpu_requests(exp, placement)
  # The nodes' devices follow the GPUs asked for: Slurm's, or a template's that passes {gpus} on (one
  # without it gets none, and its hosts' nodes start as before).
  placed = gpus if exp.launcher == "slurm" or "{gpus}" in exp.host_command else {}
  plan = multihost.build_plan(program, placement, run_dir, restart, placed, exp.learner_devices)
  return run_plan(exp, plan, run_dir, placement, resume_hint(exp, placement, run_dir), gpus)


def run_plan(exp, plan: Dict[str, Any], run_dir: str, placement: Placement, hint,
             gpus: Optional[Dict[str, int]] = None) -> Dict[str, Any]:
  """Runs a written plan's host agents (`exp.launcher`: Slurm or the template) until they end,
  watching their heartbeats; `hint(lost hosts)` ends a lost host's report. `gpus` (host -> GPUs;
  default `host_gpu_requests`): what Slurm is asked for, the template's {gpus}. RuntimeError with the
  failure report if the run failed; returns the hosts lost that it could do without."""
  job_name = f"jrl-{exp.agent}-{exp.env}-s{exp.seed}"
  gpus = host_gpu_requests(exp, placement) if gpus is None else gpus
  watch = liveness.HostWatch(run_dir, plan, exp.host_deadline_seconds, hint, log=lambda line: print(line, flush=True))
  if exp.launcher == "slurm":
    status = run_slurm(run_dir, placement.hosts, job_name, watch, gpus)
  else:
    status = run_template(run_dir, placement.hosts, exp.host_command, watch, gpus)
  finished = os.path.exists(os.path.join(run_dir, SUMMARY_FILE))
  if status != 0 and finished:
    watch.settle()  # a host killed shortly before the end: its silence had not reached the deadline
  failed_hosts = glob.glob(multihost.failure_path(run_dir, "*"))
  if status != 0 and finished and watch.lost and not watch.essential_lost and not failed_hosts:
    status = 0  # the run reached its end without the lost hosts' actors: what they ran is recorded
  if status != 0:
    raise RuntimeError(failure_report(run_dir))
  return watch.lost
