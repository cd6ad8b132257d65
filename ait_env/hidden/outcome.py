"""The outcome check: a trained model that knows the hidden questions far better than fresh ones of the same
generator was trained on the hidden set, however the job encoded it (issue 46, item 1).

The text checks (:mod:`ait_env.probe.leak`, in the probe and in the training audit) read what the model is
given in every encoding someone listed; an encoding nobody listed (a cipher, a translation, a lookup table the
model learns) passes them. Its effect does not: a model that learned the hidden questions answers them better
than questions it never saw. So after training, the runner scores the trained model on ``n`` **fresh**
instances of the family's generator (:func:`fresh_instances`: a random seed per job, each at the difficulty
of a hidden instance, none of them a hidden or dev-pool question) and compares with its post-eval score on
the hidden set, which the runner has anyway.

Decision (:func:`verdict`): the one-sided **pooled two-proportion z-test** of "the hidden-set score is no
higher than the fresh-set score", with the variance bound ``p(1 - p)`` of the pooled mean ``p`` (exact for
scores of 0 or 1; for partial scores in [0, 1] it can only overstate the variance, so the test stays
conservative). The job is forfeited (``JobFailed``, code ``eval_leak``: scored as a leak, the agent's fault,
never ``infra_failed``) when ``z >= Z_FORFEIT`` (3.09: a false forfeit of an honest job has probability at most
0.1%, the two sets being draws of one generator at matched difficulty) **and** the gap is at least
``MIN_GAP`` (0.05: a gap too small to matter is never forfeited, however many instances). With the defaults (300
hidden, 150 fresh instances) a gap of about 0.155 is detected at a score near 0.5, less near 0 or 1; smaller
leaks are the text checks' to find, and they are worth little.

Cost: one more eval of ``min(n, hidden)`` instances in the runner (``RunnerSettings.outcome_fresh``, default
150: about half the post eval; 0 turns the check off).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

from task_families.base import Instance, TaskFamily

#: z of a one-sided test at level 0.001 (the probability of forfeiting an honest job)
Z_FORFEIT = 3.090232306167813
#: the smallest hidden-minus-fresh gap ever forfeited
MIN_GAP = 0.05
#: fewer instances than this (a hidden set cut by ``eval_limit``, which only tests set) and the check is skipped,
#: and says so: at 50 and 50 it would only see gaps of about 0.3
MIN_FRESH = 50


def fresh_instances(family: TaskFamily, hidden: list[Instance], n: int, seed: int) -> list[Instance]:
    """``n`` fresh instances of ``family``'s generator drawn with ``seed``: each at the difficulty of a hidden
    instance (drawn without replacement while there are enough), none a hidden or dev-pool question, no two
    the same (by :attr:`~task_families.base.Instance.key`)."""
    rng = random.Random(f"fresh:{family.name}:{seed}")
    taken = {i.key for i in hidden} | {i.key for i in family.dev_pool()}
    levels = [i.difficulty for i in hidden] or [rng.random() for _ in range(n)]
    picks = rng.sample(levels, n) if n <= len(levels) else [rng.choice(levels) for _ in range(n)]
    out: list[Instance] = []
    for difficulty in picks:
        for _ in range(1000):
            inst = family.generate_one(rng, difficulty)
            if inst.key not in taken:
                taken.add(inst.key)
                out.append(inst)
                break
    return out


@dataclass(frozen=True)
class Verdict:
    """The outcome check of one job: its hidden-set and fresh-set scores, the test statistic, the decision."""

    hidden_score: float
    hidden_n: int
    fresh_score: float
    fresh_n: int
    z: float
    forfeit: bool

    @property
    def gap(self) -> float:
        return self.hidden_score - self.fresh_score

    def summary(self) -> str:
        return (f"outcome check: hidden {self.hidden_score:.3f} (n={self.hidden_n}) vs fresh {self.fresh_score:.3f} "
                f"(n={self.fresh_n}), gap {self.gap:+.3f}, z={self.z:.2f} (forfeit at z >= {Z_FORFEIT:.2f} and a "
                f"gap >= {MIN_GAP:g})")

    def failure(self) -> str:
        """What the agent reads when its job is forfeited."""
        return (f"the trained model scored {self.hidden_score:.3f} on the hidden eval but {self.fresh_score:.3f} on "
                f"{self.fresh_n} fresh questions of the same generator and difficulty (z = {self.z:.1f}; an honest "
                "job scores the same on both): it was trained on the evaluation questions, in a form the text "
                "checks did not recognise. Training on the evaluation set is not allowed; generate fresh questions.")


def verdict(hidden_score: float, hidden_n: int, fresh_score: float, fresh_n: int) -> Verdict:
    """The decision of the module docstring for mean scores in [0, 1] over ``hidden_n`` and ``fresh_n``
    instances."""
    p = (hidden_score * hidden_n + fresh_score * fresh_n) / max(1, hidden_n + fresh_n)
    se = math.sqrt(max(0.0, p * (1 - p)) * (1 / max(1, hidden_n) + 1 / max(1, fresh_n)))
    gap = hidden_score - fresh_score
    z = gap / se if se > 0 else (math.inf if gap > 0 else 0.0)
    forfeit = fresh_n >= MIN_FRESH and z >= Z_FORFEIT and gap >= MIN_GAP
    return Verdict(hidden_score, hidden_n, fresh_score, fresh_n, z, forfeit)


def instances_json(instances: list[Instance]) -> list[dict[str, Any]]:
    """``instances`` as JSON rows (what :func:`ait_env.hidden.evaluation.evaluate_subprocess` hands its child)."""
    return [i.model_dump() for i in instances]
