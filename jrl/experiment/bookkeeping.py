"""Run bookkeeping shared by every form of a run: the evaluation history and the
success-threshold rule (`jrl.experiment.builder.success_threshold` gives the threshold)."""

import dataclasses
from typing import Any, Dict, List, Optional, Sequence

import numpy as np


@dataclasses.dataclass
class EvalHistory:
  """Mean return of every evaluation, the best one, and when the threshold was first reached."""
  threshold: Optional[float]
  returns: List[float] = dataclasses.field(default_factory=list)
  actor_steps: List[int] = dataclasses.field(default_factory=list)
  steps_to_threshold: Optional[int] = None

  def record(self, actor_steps: int, episode_returns, mean: Optional[float] = None) -> Dict[str, float]:
    """Adds one evaluation; returns its metric row (`is_best` tells whether it is the new best).
    `mean`: the returns' mean as the evaluating device computed it (its float32 sum order), so
    that a decision taken there on it (a new best, the threshold) is the one recorded here."""
    mean = float(np.mean(episode_returns)) if mean is None else float(mean)
    is_best, = self.extend([actor_steps], [mean])
    return evaluation_row(mean, episode_returns, is_best)

  def extend(self, actor_steps: Sequence[int], means: Sequence[float]) -> List[bool]:
    """Adds evaluations by their mean returns, in order; whether each was a new best (the first,
    or above every one before it)."""
    best = max(self.returns) if self.returns else None
    bests = []
    for steps, mean in zip(actor_steps, means):
      mean = float(mean)
      bests.append(best is None or mean > best)
      best = mean if bests[-1] else best
      self.returns.append(mean)
      self.actor_steps.append(int(steps))
      if self.steps_to_threshold is None and self.threshold is not None and mean >= self.threshold:
        self.steps_to_threshold = int(steps)
    return bests

  @property
  def reached(self) -> bool:
    return self.steps_to_threshold is not None

  @property
  def count(self) -> int:
    return len(self.returns)

  def summary(self) -> Dict[str, Any]:
    return {"eval_return": self.returns[-1] if self.returns else None,
            "best_eval_return": max(self.returns) if self.returns else None,
            "evaluations": self.count,
            "reward_threshold": self.threshold, "steps_to_threshold": self.steps_to_threshold}

  def state(self) -> Dict[str, Any]:
    return dataclasses.asdict(self)

  @classmethod
  def from_state(cls, state: Dict[str, Any]) -> "EvalHistory":
    return cls(**state)


def evaluation_row(mean: float, episode_returns, is_best: bool) -> Dict[str, float]:
  """An evaluation's metric row: its mean (as recorded) and its returns' spread."""
  return {"eval_return": float(mean), "eval_return_std": float(np.std(episode_returns)),
          "eval_return_min": float(np.min(episode_returns)), "eval_return_max": float(np.max(episode_returns)),
          "is_best": float(is_best)}
