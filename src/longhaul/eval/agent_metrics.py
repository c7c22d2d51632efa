"""What an agent did over a set of episodes, beyond whether it passed.

From the counters the agent loop puts in each multi-turn `Trajectory.info` (`submitted`,
`turns`, `invalid_calls`, `failed_calls`, `repeated_calls`, `elided`):
- `pass_rate`: episodes the hidden checks passed;
- `submit_rate`: episodes that ended by calling submit (the rest ran out of turns or context);
- `turns_to_submit`: mean assistant turns of the episodes that submitted;
- `invalid_calls`: mean malformed or unknown tool calls an episode (replies with no call count);
- `loop_rate`: episodes that sent the same reply twice or more;
- `repair_rate`: of the episodes in which a command, the tests or a tool call failed, the share
  that ended solved: the agent read the error and recovered;
- `elided_rate`: episodes whose old tool outputs were elided to fit the context.
Single-turn trajectories (no `turns` counter) are left out. Owns the arithmetic only.
"""

from __future__ import annotations


def agent_metrics(trajs) -> dict[str, float]:
    eps = [t.info for t in trajs if "submitted" in t.info and t.info.get("ended") != "infra_error"]
    if not eps:
        return {}
    n = len(eps)
    submitted = [e for e in eps if e["submitted"]]
    failed = [e for e in eps if e.get("failed_calls", 0) > 0]
    return {
        "episodes": n,
        "pass_rate": sum(bool(e.get("passed")) for e in eps) / n,
        "submit_rate": len(submitted) / n,
        "turns_to_submit": sum(e["turns"] for e in submitted) / len(submitted) if submitted else None,
        "turns": sum(e["turns"] for e in eps) / n,
        "invalid_calls": sum(e.get("invalid_calls", 0) for e in eps) / n,
        "loop_rate": sum(e.get("repeated_calls", 0) > 0 for e in eps) / n,
        "repair_rate": sum(bool(e.get("passed")) for e in failed) / len(failed) if failed else None,
        "episodes_with_failures": len(failed),
        "elided_rate": sum(e.get("elided", 0) > 0 for e in eps) / n,
    }
