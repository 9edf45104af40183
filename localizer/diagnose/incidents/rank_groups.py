"""The process groups and pipeline stage of a hang's or crash's culprit, and how the waiting ranks
reach it (issue 31). Pure; no I/O.

Each hang snapshot carries the groups its rank belongs to, as ``torch.distributed`` described them
when it was taken (``HangSnapshot.groups``: name, description, global ranks). A silent culprit
(stopped, dead) sent none; its groups are those of the other ranks' snapshots that hold it.

- **Its groups**: the culprit's groups smaller than the world (a tensor-parallel pair, a
  data-parallel column, a pipeline), named by their description ("mesh_tp") and ranks.
- **Its stage**: where the culprit's stack is in ``torch.distributed.pipelining``, its place in its
  pipeline group (a group described with "pp" or "pipe"), or in the world where it has no such
  group (a job whose pipeline is the whole world): "pipeline stage 1 of 2". Inferred from the rank's
  place in the group, as ``PipelineStage`` is usually built; a schedule that maps stages otherwise
  (interleaved, looped) is not seen.
- **The waiting ranks**: those that share a group with the culprit wait for it directly; the others
  wait one hop further (for ranks that wait for it).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from perftracker.model import Frame, HangSnapshot, compress_ranks

Group = tuple[str, str, tuple[int, ...]]
_PIPELINING = "torch/distributed/pipelining/"


def job_groups(snaps: Iterable[HangSnapshot]) -> list[Group]:
    """Every group the snapshots name, once (by its ranks and description), in first-seen order."""
    seen: dict[tuple[str, tuple[int, ...]], Group] = {}
    for s in snaps:
        for name, desc, ranks in s.groups:
            key = (desc, tuple(sorted(ranks)))
            seen.setdefault(key, (name, desc, tuple(sorted(ranks))))
    return list(seen.values())


def sub_groups(rank: int, groups: Sequence[Group], world: int) -> list[Group]:
    """The groups of ``rank`` smaller than the world, smallest first."""
    return sorted((g for g in groups if rank in g[2] and len(g[2]) < world), key=lambda g: (len(g[2]), g[1]))


def group_text(g: Group) -> str:
    name, desc, ranks = g
    label = desc or f"group {name}"
    return f"{label} (ranks {compress_ranks(list(ranks))})"


def stage_of(rank: int, groups: Sequence[Group], stack: Sequence[Frame], world: int) -> tuple[int, int] | None:
    """(stage, stages) of a rank whose stack is in torch.distributed.pipelining, else None."""
    if not any(_PIPELINING in f.file for f in stack):
        return None
    pipes = [g for g in groups if rank in g[2] and ("pp" in g[1].lower() or "pipe" in g[1].lower())]
    if pipes:
        ranks = sorted(min(pipes, key=lambda g: len(g[2]))[2])
        return ranks.index(rank), len(ranks)
    if world > 1 and 0 <= rank < world:
        return rank, world
    return None


def culprit_clause(rank: int, groups: Sequence[Group], stack: Sequence[Frame], world: int) -> str:
    """"pipeline stage 1 of 2; in mesh_tp (ranks 0-1), mesh_dp (ranks 1,3)", or "" when nothing is known."""
    parts = []
    stage = stage_of(rank, groups, stack, world)
    if stage is not None:
        parts.append(f"pipeline stage {stage[0]} of {stage[1]}")
    subs = sub_groups(rank, groups, world)
    if subs:
        parts.append("in " + ", ".join(group_text(g) for g in subs))
    return "; ".join(parts)


def hops(culprits: Iterable[int], waiters: Iterable[int], groups: Sequence[Group], world: int
         ) -> tuple[list[int], list[int]]:
    """(waiting ranks that share a group smaller than the world with a culprit, the others)."""
    near: set[int] = set()
    for c in culprits:
        for g in sub_groups(c, groups, world):
            near |= set(g[2])
    ws = sorted(set(waiters))
    return [r for r in ws if r in near], [r for r in ws if r not in near]


def hops_clause(culprits: Sequence[int], waiters: Iterable[int], groups: Sequence[Group], world: int) -> str:
    """"rank 0 waits for it in its group, ranks 2-3 one hop further (through the ranks that wait for
    it)", or "" when the groups say nothing (no group smaller than the world)."""
    if not any(sub_groups(c, groups, world) for c in culprits):
        return ""
    near, far = hops(culprits, waiters, groups, world)
    if not far or not near:
        return ""  # every waiter in one of its groups, or none: the groups add nothing
    obj = "it" if len(culprits) == 1 else "them"
    return (f"{_ranks(near)} {'waits' if len(near) == 1 else 'wait'} for {obj} in {'its' if obj == 'it' else 'their'} "
            f"group{'s' if len(culprits) > 1 else ''}, {_ranks(far)} one hop further (for the ranks that wait for {obj})")


def _ranks(rs: Sequence[int]) -> str:
    return f"rank {rs[0]}" if len(rs) == 1 else f"ranks {compress_ranks(list(rs))}"
