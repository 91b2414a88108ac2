"""The built-in agents: name -> the module (a folder `jrl/agents/<name>/`) with the five pieces.

Adding an agent is its folder, a line here and its docs page; nothing else in the tree names it.
It sits outside `jrl.agents` and imports nothing, so `import jrl` lists the agents without loading
JAX (importing the `jrl.agents` package loads rlax and distrax).
"""

AGENTS = {
    "dqn": "jrl.agents.dqn",
    "impala": "jrl.agents.impala",
    "ppo": "jrl.agents.ppo",
    "pqn": "jrl.agents.pqn",
    "r2d2": "jrl.agents.r2d2",
    "sac": "jrl.agents.sac",
    "td3": "jrl.agents.td3",
}
