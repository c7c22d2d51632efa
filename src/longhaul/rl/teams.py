"""Team episodes as GRPO groups: one group per (task, role), so that advantages are grouped by role
and, with the `turn_level` estimator, by turn.

With several roles, "the same prompt, several answers" does not hold across roles: a coder's and
a tester's prompts differ, and so do a role's first and fifth reply. After AT-GRPO (Stronger-MAS,
2026), each role's trajectories of one task's episodes form a group of their own; `turn_level`
then gives reply k of a role the team reward minus the mean of the other episodes of that task
in which the same role had a k-th reply (leave-one-out). How it deviates from AT-GRPO: episodes
are sampled independently, not as a tree from shared turn prefixes, so "turn k" is a role's k-th
reply, not a state several candidates branch from. Episodes that ended in an infrastructure error
stay in their groups marked as such; the trainer fills their reward with the others' mean and
trains on none of their tokens. Sampling the episodes is `longhaul.agent.team`'s job.
"""

from __future__ import annotations

from longhaul.types import Trajectory


def role_groups(episodes: list[list[Trajectory]]) -> tuple[list[list[Trajectory]], list[tuple[int, str]]]:
    """Per-role trajectories of team episodes (`run_team`'s output, `Trajectory.group` naming the
    task) regrouped as one group per (task group, role), in first-seen order, with those keys.
    Every task must have the same number of episodes, each with every role (GRPO's (G, N))."""
    groups: dict[tuple[int, str], list[Trajectory]] = {}
    for trajs in episodes:
        for t in trajs:
            groups.setdefault((t.group, t.info["role"]), []).append(t)
    sizes = {len(g) for g in groups.values()}
    if len(sizes) > 1:
        raise ValueError(f"role groups differ in size ({sorted(sizes)}); run the same number of episodes of every task")
    return list(groups.values()), list(groups)
