"""Rollouts: groups of G answers per problem, with partial rollouts (unfinished answers are
cancelled and resume later, each token remembering the weights version that drew it);
deterministic, whatever the batch, and its whole state is JSON for checkpoints."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ratchet.engine.request import Request


class DataStream:
    """Problem order: epoch e visits the problems in `default_rng([seed, e]).permutation(n)`.

    Worker `rank` of `world` takes stream positions rank, rank + world, ...
    """

    def __init__(self, num_problems: int, seed: int, rank: int = 0, world: int = 1,
                 position: int = 0):
        if num_problems < 1:
            raise ValueError("data stream: no problems to draw from")
        self.num_problems, self.seed, self.rank, self.world = num_problems, seed, rank, world
        self.position = position  # this worker's draws so far
        self._epoch, self._order = -1, np.empty(0, dtype=np.int64)

    def next(self) -> tuple[int, int]:
        """(global stream index, problem row)."""
        index = self.position * self.world + self.rank
        self.position += 1
        epoch, offset = divmod(index, self.num_problems)
        if epoch != self._epoch:
            self._epoch = epoch
            self._order = np.random.default_rng([self.seed, epoch]).permutation(self.num_problems)
        return index, int(self._order[offset])


@dataclass
class Group:
    index: int  # position in the data stream; names the request ids
    problem: int  # row of the training split
    born: int  # the step whose collect started it
    requests: list[Request]
    versions: list[list[int]] = field(default_factory=list)  # per answer, per token

    @property
    def finished(self) -> bool:
        return all(r.finish_reason is not None for r in self.requests)

    def to_dict(self) -> dict:
        """The group as plain data of this moment: copies of its lists, never the live ones. An
        unfinished answer's lists grow at its next collect, and the split engine on a thread
        hands this to the trainer, whose checkpoint writes it out seconds later."""
        return {"index": self.index, "problem": self.problem, "born": self.born,
                "versions": [list(v) for v in self.versions],
                "requests": [{"request_id": r.request_id, "prompt": list(r.prompt),
                              "max_new_tokens": r.max_new_tokens, "temperature": r.temperature,
                              "seed": r.seed, "output": list(r.output), "logprobs": list(r.logprobs),
                              "finish_reason": r.finish_reason} for r in self.requests]}

    @classmethod
    def from_dict(cls, d: dict) -> "Group":
        return cls(d["index"], d["problem"], d["born"],
                   [Request(**{**r, "output": list(r["output"]), "logprobs": list(r["logprobs"])})
                    for r in d["requests"]],
                   [list(v) for v in d["versions"]])


class Rollouts:
    def __init__(self, prompts: list[list[int]], group_size: int, max_new_tokens: int,
                 temperature: float, seed: int, groups_per_step: int, extra_groups: int = 0,
                 max_staleness: int = 1, rank: int = 0, world: int = 1):
        if groups_per_step < 1 or group_size < 1:
            raise ValueError("rollouts: groups_per_step and group_size must be >= 1")
        self.prompts, self.group_size = prompts, group_size
        self.max_new_tokens, self.temperature, self.seed = max_new_tokens, temperature, seed
        self.groups_per_step, self.extra_groups = groups_per_step, extra_groups
        self.max_staleness = max_staleness
        self.stream = DataStream(len(prompts), seed, rank, world)
        self.in_flight: list[Group] = []
        self.num_dropped = 0

    # ------------------------------------------------------------------ the step
    def collect(self, engine, step: int, version: int) -> tuple[list[Group], dict]:
        """Run the engine until `groups_per_step` groups are complete; return those (oldest
        first) and rollout statistics. Leaves the engine idle."""
        dropped = self._drop_stale(step)
        while len(self.in_flight) < self.groups_per_step + self.extra_groups:
            self.in_flight.append(self._new_group(step))
        lengths = {r.request_id: len(r.output) for g in self.in_flight for r in g.requests}
        for group in self.in_flight:
            for request in group.requests:
                if request.finish_reason is None:
                    engine.add(request)
        resumed = sum(1 for g in self.in_flight for r in g.requests
                      if r.finish_reason is None and r.output)
        while sum(g.finished for g in self.in_flight) < self.groups_per_step:
            if engine.num_unfinished == 0:
                raise RuntimeError("rollouts: the engine is idle but groups are unfinished")
            engine.step()
        engine.cancel_all()  # the stragglers keep their tokens and resume next time
        for group in self.in_flight:  # tokens drawn now were drawn with `version`
            for request, versions in zip(group.requests, group.versions):
                versions += [version] * (len(request.output) - lengths[request.request_id])
        done = [g for g in self.in_flight if g.finished][:self.groups_per_step]
        taken = {g.index for g in done}
        self.in_flight = [g for g in self.in_flight if g.index not in taken]
        stats = {"rollout/dropped_groups": dropped, "rollout/resumed_answers": resumed,
                 "rollout/in_flight_groups": len(self.in_flight),
                 "rollout/group_age_max": max(step - g.born for g in done)}
        return done, stats

    def _new_group(self, step: int) -> Group:
        index, problem = self.stream.next()
        g = self.group_size
        requests = [Request(request_id=index * g + i, prompt=list(self.prompts[problem]),
                            max_new_tokens=self.max_new_tokens, temperature=self.temperature,
                            seed=self.seed) for i in range(g)]
        return Group(index, problem, step, requests, [[] for _ in range(g)])

    def _drop_stale(self, step: int) -> int:
        keep = [g for g in self.in_flight if step - g.born <= self.max_staleness]
        dropped = len(self.in_flight) - len(keep)
        self.in_flight = keep
        self.num_dropped += dropped
        return dropped

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        return {"position": self.stream.position, "num_dropped": self.num_dropped,
                "in_flight": [g.to_dict() for g in self.in_flight]}

    def load_state_dict(self, state: dict) -> None:
        self.stream.position = state["position"]
        self.num_dropped = state["num_dropped"]
        self.in_flight = [Group.from_dict(d) for d in state["in_flight"]]
