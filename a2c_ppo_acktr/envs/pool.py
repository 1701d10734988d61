"""The one episode runner: a fixed pool of envs, each slot running one episode after another.

Evaluation (:func:`a2c_ppo_acktr.eval.evaluation.run_episodes`) and labelling
(:func:`a2c_ppo_acktr.labels.labeling.label_trajectories`) both run a list of episodes on a few envs
stepped together: every slot starts the next job when its episode ends, and one batched call (the
agent's or the teacher's) answers every running slot each round. What differs (what an episode
records, where it goes) is in the callbacks.
"""

from __future__ import annotations

from typing import Callable, Iterable, Optional, Sequence, TypeVar

Job = TypeVar("Job")
State = TypeVar("State")
Reply = TypeVar("Reply")


def run_slots(
    num_slots: int,
    jobs: Iterable[Job],
    start: Callable[[int, Job], Optional[State]],
    act: Callable[[Sequence[int], Sequence[State]], Sequence[Reply]],
    step: Callable[[int, State, Reply], bool],
) -> None:
    """Run every job on ``num_slots`` slots.

    Args:
        num_slots: Episodes running at once (one env per slot).
        jobs: The episodes to run, in order; a free slot takes the next one.
        start: ``start(slot, job)`` resets the slot's env for ``job`` and returns the episode's state,
            or None to skip the job (the slot then takes the next one).
        act: ``act(slots, states)``: one reply per running slot, in order (one batched call).
        step: ``step(slot, state, reply)`` applies the reply; True when the episode is over (the
            slot then starts the next job).

    Raises:
        RuntimeError: ``act`` returned a different number of replies than running slots.
    """
    pending = iter(jobs)
    states: list[Optional[State]] = [None] * num_slots

    def fill(slot: int) -> None:
        states[slot] = None
        for job in pending:
            state = start(slot, job)
            if state is not None:
                states[slot] = state
                return

    for slot in range(num_slots):
        fill(slot)
    while any(s is not None for s in states):
        active = [k for k, s in enumerate(states) if s is not None]
        replies = act(active, [states[k] for k in active])
        if len(replies) != len(active):
            raise RuntimeError(f"{len(replies)} replies for {len(active)} running episodes")
        for slot, reply in zip(active, replies):
            if step(slot, states[slot], reply):
                fill(slot)
