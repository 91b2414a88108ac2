"""The distributed program's topology as a Launchpad program (the full stack's engine).

  counter (the counts, the run core's books, the budget)   replay (ReverbNode)   learner (variable source)
  actor x N --insert--> replay --sample--> learner
  actor --obs bytes--> inference server x M (inference=server) --params-- learner
  driver (group "evaluator"): the run core's loop (jrl.run.core) over the program:
    evaluates, saves policies, prints progress, has the learner checkpoint, and when the counter
    says the budget is reached writes summary.json and stops the program

The nodes are `counter`, `learner_node`, `actor_node`, `inference_node` and `driver_node` of
`jrl.run.distributed`, given the Launchpad engine (`launchpad_engine.LAUNCHPAD`); launching the
program (supervised local_mp, local_mt, several hosts) is the launchers' (`launch.distributed`,
`launch.cluster`).
"""

from jrl import compat

compat.import_jax_probability()  # before anything imports TensorFlow

import functools
import os
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

import launchpad as lp

from jrl.experiment.config import ExperimentConfig
from jrl.replay.checkpoint_names import REVERB_REPLAY_DIR
from jrl.run.distributed.actor_node import ActorNode
from jrl.run.distributed.counter import Counter
from jrl.run.distributed.driver_node import DriverNode
from jrl.run.distributed.inference_node import InferenceNode
from jrl.run.distributed.launchpad_engine import LAUNCHPAD, make_replay_tables, reverb_checkpointer
from jrl.run.distributed.learner_node import LearnerNode
from jrl.run.distributed.node_io import Session


class ProgramNodes(NamedTuple):
  """The handles of a program's nodes, for nodes of your own to call (Courier RPC):
  `learner.get_variables()` -> (params as numpy, version); `counter.get_counts()` -> the run's
  counts (actor_steps, learner_steps, episodes, wall_seconds, ...); `replay` is the Reverb node."""
  counter: Any
  replay: Any
  learners: List[Any]           # one per learner process; learners[0] serves the parameters
  inference_servers: List[Any]  # empty unless inference=server
  actors: List[Any]
  evaluator: Any                # the driver node (jrl.run.distributed.driver_node.DriverNode), in the group "evaluator"

  @property
  def learner(self) -> Any:
    return self.learners[0]


def build_program(exp: ExperimentConfig, agent_cfg, session: Session,
                  counter_state: Optional[Dict[str, Any]] = None) -> Tuple[lp.Program, ProgramNodes]:
  """The topology and its nodes' handles; a resumed session starts the counter, learner and
  replay from its checkpoint."""
  replay_restore = (os.path.join(session.checkpoint, "replay", REVERB_REPLAY_DIR) if session.checkpoint else None)
  engine = LAUNCHPAD
  program = lp.Program("jrl")
  with program.group("counter"):
    counter = program.add_node(lp.CourierNode(Counter, counter_state, exp.steps))
  with program.group("replay"):
    replay = program.add_node(lp.ReverbNode(functools.partial(make_replay_tables, exp, agent_cfg),
                                            functools.partial(reverb_checkpointer, session.run_dir, replay_restore)))
  with program.group("learner"):
    learners = [program.add_node(lp.CourierNode(LearnerNode, exp, agent_cfg, replay, counter, session, i,
                                                engine=engine)) for i in range(exp.num_processes)]
  learner = learners[0]  # serves the parameters
  servers = []
  if exp.inference == "server":
    with program.group("inference"):
      for server_id in range(exp.num_inference_servers):
        assigned = len(range(server_id, exp.num_actors, exp.num_inference_servers))
        servers.append(program.add_node(lp.CourierNode(InferenceNode, exp, agent_cfg, learner, assigned,
                                                       server_id, counter, session, engine=engine)))
  actors = []
  with program.group("actor"):
    for actor_id in range(exp.num_actors):
      server = servers[actor_id % len(servers)] if servers else None
      actors.append(program.add_node(lp.CourierNode(ActorNode, actor_id, exp, agent_cfg, replay, learner,
                                                    counter, server, session, engine=engine)))
  with program.group("evaluator"):  # the driver node keeps the group's name (logs, pids, restarts)
    evaluator = program.add_node(lp.CourierNode(DriverNode, exp, agent_cfg, learner, counter, servers,
                                                session, replay, engine=engine))
  return program, ProgramNodes(counter, replay, learners, servers, actors, evaluator)


