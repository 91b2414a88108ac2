"""Atari-scale replay on one machine: frame-shared stacks against stored stacks.

  .venv/bin/python bench/frame_replay.py [--size 1000000] [--stacks_size 150000] [--out frame_replay.json]

Fills replay with DQN's n-step transitions (n 3, blocks of 8) of ALE Pong (the `atari` preset:
84x84x4 uint8 stacks) and measures, for each arm in a fresh process:
- the resident memory the replay added (RSS after filling less RSS before making it),
- the time to fill it, and sampling: learner batches of 32 transitions per second.
Arms: the seeded buffer and an in-process Reverb table, each with frames shared (`--size`
transitions) and with stored stacks (`--stacks_size`: about the most that fits in the memory
the shared layout takes for `--size`), and the shared layout at `--stacks_size` too, side by side.

The frames are real: one Pong env is played (seeded random actions, `--record` steps) and its
stream replayed by `--envs` envs, each from its own offset (each replay of the record starts a new
episode for the encoder). Nothing else should run meanwhile: RSS and rates are the machine's.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
BLOCK, N_STEP, BATCH = 8, 3, 32


def rss_bytes() -> int:
  with open("/proc/self/statm") as f:
    return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def record(steps: int, path: str) -> None:
  import numpy as np
  from jrl import envs
  env = envs.make_vector_env("ALE/Pong-v5", 1, seed=0)
  rng = np.random.default_rng(0)
  obs, _ = env.reset(seed=0)
  stacks, bootstraps, rewards, terminated, truncated = [], [], [], [], []
  for t in range(steps):
    next_obs, reward, term, trunc, info = env.step(rng.integers(0, 6, 1))
    done = term | trunc
    if t == steps - 1:
      trunc, done = np.ones(1, bool), np.ones(1, bool)
    stacks.append(obs[0])
    bootstraps.append(envs.final_observations(next_obs, term | trunc, info)[0] if done.any() and "final_obs" in info
                      else next_obs[0])
    rewards.append(reward[0]), terminated.append(term[0]), truncated.append(trunc[0])
    obs = next_obs
  env.close()
  np.savez(path, obs=np.stack(stacks), next_obs=np.stack(bootstraps), reward=np.asarray(rewards, np.float32),
           terminated=np.asarray(terminated), truncated=np.asarray(truncated))


def arm(backend: str, frame_stack: int, size: int, num_envs: int, record_path: str, seconds: float) -> dict:
  """One arm in this process: fill, measure RSS, sample."""
  import numpy as np
  if backend == "reverb":
    from jrl.replay import reverb_replay
  from jrl.replay.adders import make_block_writer
  from jrl.replay.batches import items_per_fetch, make_assembler
  from jrl.replay.buffer import SeededReplayBuffer
  from jrl.replay.kinds import Transitions
  from jrl.replay.spec import ReplaySpec
  from jrl.types import Transition

  with np.load(record_path) as saved:
    data = {k: saved[k] for k in saved.files}  # in memory before the RSS baseline
  length = len(data["reward"])
  spec = ReplaySpec(block_size=BLOCK, max_size=size, min_size=BLOCK, samples_per_insert=1.0,
                    kind=Transitions(n_step=N_STEP, discount=0.99), frame_stack=frame_stack)
  before = rss_bytes()
  server = None
  if backend == "seeded":
    writer = buffer = SeededReplayBuffer(spec, seed=0)
  else:
    obs = np.zeros((84, 84, 4), np.uint8)
    example = spec.kind.example_item(spec, Transition(obs, np.int32(0), np.float32(0), np.float32(0), obs), dict)
    table = reverb_replay.reverb.Table(reverb_replay.TABLE, reverb_replay.reverb.selectors.Uniform(),
                                       reverb_replay.reverb.selectors.Fifo(), spec.max_items,
                                       reverb_replay.reverb.rate_limiters.MinSize(1),
                                       signature=reverb_replay.item_signature(example, frame_stack))
    server = reverb_replay.start_server([table])
    address = f"localhost:{server.port}"
    writer = reverb_replay.ReverbItemWriter(reverb_replay.reverb.Client(address),
                                            **reverb_replay.frame_options(spec, num_envs))
  blocks, adder = make_block_writer(spec, writer), spec.make_adder(num_envs)
  offsets = (np.arange(num_envs) * length) // num_envs
  start = time.perf_counter()
  steps = size // num_envs + N_STEP
  for t in range(steps):
    i = (offsets + t) % length
    blocks.add(adder.add(data["obs"][i], np.zeros(num_envs, np.int32), data["reward"][i], data["terminated"][i],
                         data["truncated"][i], data["next_obs"][i]))
    if t % 20_000 == 0:
      print(f"  {backend} frame_stack={frame_stack}: {t * num_envs}/{size} transitions, "
            f"RSS +{(rss_bytes() - before) / 2**30:.2f} GiB", flush=True)
  if backend == "reverb":
    writer.flush()
  fill = time.perf_counter() - start
  held = rss_bytes() - before
  # Sampling: batches of 32 transitions (4 blocks, dealt as the learner gets them).
  items = items_per_fetch(spec, 1, BATCH)
  assemble = make_assembler(spec, 1, BATCH, np.random.default_rng(0))
  if backend == "seeded":
    sample = lambda: assemble(buffer.sample(items))
  else:
    sampler = reverb_replay.ReverbItemSampler(address, items, example, frame_stack=frame_stack)
    sample = lambda: assemble(sampler.sample())
  batch = sample().batch
  assert batch.transitions.observation.shape == (1, BATCH, 84, 84, 4)
  count, start = 0, time.perf_counter()
  while time.perf_counter() - start < seconds:
    sample()
    count += 1
  rate = count / (time.perf_counter() - start)
  if server is not None:
    writer.close()
  return {"backend": backend, "frames": "shared" if frame_stack else "stacks", "transitions": size,
          "replay_rss_gib": round(held / 2**30, 3), "bytes_per_transition": round(held / size),
          "fill_seconds": round(fill, 1), "batches_per_second": round(rate, 1)}


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--size", type=int, default=1_000_000)
  parser.add_argument("--stacks_size", type=int, default=150_000)
  parser.add_argument("--envs", type=int, default=8)
  parser.add_argument("--record", type=int, default=10_000)
  parser.add_argument("--seconds", type=float, default=10.0)
  parser.add_argument("--backends", default="seeded,reverb")
  parser.add_argument("--out", default="frame_replay.json")
  parser.add_argument("--arm", default=None, help=argparse.SUPPRESS)  # backend,frame_stack,size,record_path
  args = parser.parse_args()
  if args.arm:
    backend, frame_stack, size, path = args.arm.split(",")
    print("RESULT " + json.dumps(arm(backend, int(frame_stack), int(size), args.envs, path, args.seconds)), flush=True)
    return
  path = os.path.join(tempfile.mkdtemp(prefix="frame-replay-"), "pong.npz")
  print(f"recording {args.record} Pong steps", flush=True)
  record(args.record, path)
  results = []
  for backend in args.backends.split(","):
    for frame_stack, size in ((0, args.stacks_size), (4, args.stacks_size), (4, args.size)):
      done = subprocess.run([sys.executable, __file__, "--arm", f"{backend},{frame_stack},{size},{path}",
                             "--envs", str(args.envs), "--seconds", str(args.seconds)],
                            capture_output=True, text=True, cwd=ROOT)
      lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
      if done.returncode != 0 or not lines:
        print(f"{backend} frame_stack={frame_stack} size={size} failed ({done.returncode}):\n{done.stdout[-2000:]}"
              f"\n{done.stderr[-3000:]}", flush=True)
        continue
      result = json.loads(lines[-1][len("RESULT "):])
      results.append(result)
      print(f"{backend:7s} {result['frames']:7s} {size:>8d} transitions: replay RSS {result['replay_rss_gib']:6.2f} GiB "
            f"({result['bytes_per_transition']} B each), fill {result['fill_seconds']:6.1f} s, "
            f"{result['batches_per_second']:7.1f} batches of {BATCH}/s", flush=True)
  with open(args.out, "w") as f:
    json.dump({"size": args.size, "stacks_size": args.stacks_size, "envs": args.envs, "results": results}, f, indent=1)


if __name__ == "__main__":
  main()
