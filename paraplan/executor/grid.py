"""Process grid: which ranks form the TP, DP, PP and EP groups (picotron style, no singleton).

Rank layout (Megatron-LM order, tp fastest, the same as ``paraplan.simulator.step``)::

    ranks = torch.arange(world).view(pp, dp, tp)
    rank  = tp_r + tp * (dp_r + dp * pp_r)

Expert parallelism splits each stage's data-parallel dimension: an EP group is ``ep``
consecutive dp ranks (same pp and tp coordinates), and the expert-data-parallel (EDP) group of
a rank is the ``dp // ep`` ranks that hold the same experts (same ``dp_r % ep``), over which
expert gradients are reduced.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def grid_shape_error(dp: int, pp: int, tp: int, ep: int, world_size: int) -> str | None:
    """The reason the degrees do not fit ``world_size`` ranks, or None when they do."""
    for name, value in (("dp", dp), ("pp", pp), ("tp", tp), ("ep", ep)):
        if value < 1:
            return f"{name}={value} must be >= 1"
    if dp * pp * tp != world_size:
        return (f"dp={dp} * pp={pp} * tp={tp} = {dp * pp * tp} does not equal the world size "
                f"{world_size}; choose degrees whose product is {world_size}")
    if dp % ep:
        return (f"ep={ep} does not divide dp={dp}; expert parallelism splits the data-parallel "
                f"ranks, choose ep in {[d for d in range(1, dp + 1) if dp % d == 0]}")
    return None


class ProcessGrid:
    """This rank's coordinates and process groups on a ``pp x dp x tp`` grid.

    Every rank must construct the grid in the same order (``new_group`` is collective).

    Args:
        dp: data-parallel degree.
        pp: pipeline-parallel degree (number of stages).
        tp: tensor-parallel degree.
        ep: expert-parallel degree; divides ``dp``.
        rank: this process's global rank (default: ``dist.get_rank()``).
        world_size: number of processes (default: ``dist.get_world_size()``).

    Raises:
        ValueError: when the degrees do not multiply to the world size or ``ep`` does not
            divide ``dp``.
    """

    def __init__(self, dp: int, pp: int, tp: int, ep: int = 1, *, rank: int | None = None,
                 world_size: int | None = None) -> None:
        world_size = dist.get_world_size() if world_size is None else world_size
        error = grid_shape_error(dp, pp, tp, ep, world_size)
        if error:
            raise ValueError(f"invalid process grid: {error}")
        self.dp, self.pp, self.tp, self.ep = dp, pp, tp, ep
        self.world_size = world_size
        self.rank = dist.get_rank() if rank is None else rank
        self.grid = torch.arange(world_size).view(pp, dp, tp)
        coords = (self.grid == self.rank).nonzero()[0].tolist()
        self.pp_rank, self.dp_rank, self.tp_rank = coords
        self.ep_rank = self.dp_rank % ep
        self._groups: list[dist.ProcessGroup] = []
        self.tp_group = self._new_groups(self.grid.reshape(-1, tp), self.grid[self.pp_rank,
                                                                              self.dp_rank])
        self.dp_group = self._new_groups(self.grid.transpose(1, 2).reshape(-1, dp),
                                         self.grid[self.pp_rank, :, self.tp_rank])
        self.pp_group = self._new_groups(self.grid.permute(1, 2, 0).reshape(-1, pp),
                                         self.grid[:, self.dp_rank, self.tp_rank])
        # EP: ep consecutive dp ranks; EDP: dp ranks with the same ep_rank.
        by_dp = self.grid.transpose(1, 2).reshape(pp, tp, dp // ep, ep)
        mine = self.grid[self.pp_rank, :, self.tp_rank].view(dp // ep, ep)
        self.ep_group = self._new_groups(by_dp.reshape(-1, ep), mine[self.dp_rank // ep])
        self.edp_group = self._new_groups(by_dp.transpose(2, 3).reshape(-1, dp // ep),
                                          mine[:, self.ep_rank])
        self.tp_ranks = self.grid[self.pp_rank, self.dp_rank].tolist()
        self.dp_ranks = self.grid[self.pp_rank, :, self.tp_rank].tolist()
        self.pp_ranks = self.grid[:, self.dp_rank, self.tp_rank].tolist()

    def _new_groups(self, all_groups: torch.Tensor, mine: torch.Tensor) -> dist.ProcessGroup:
        """Create every group (rows of ``all_groups``) collectively; return this rank's one."""
        wanted = mine.tolist()
        found: dist.ProcessGroup | None = None
        for row in all_groups.tolist():
            group = dist.new_group(row)
            if row == wanted:
                self._groups.append(group)
                found = group
        assert found is not None, f"rank {self.rank} is in no group of {all_groups.tolist()}"
        return found

    @property
    def is_first_stage(self) -> bool:
        """True on pipeline stage 0 (holds the embeddings)."""
        return self.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        """True on the last pipeline stage (holds the final norm, LM head and loss)."""
        return self.pp_rank == self.pp - 1

    @property
    def prev_rank(self) -> int | None:
        """Global rank of the same (dp, tp) position on the previous stage, or None."""
        return None if self.is_first_stage else self.pp_ranks[self.pp_rank - 1]

    @property
    def next_rank(self) -> int | None:
        """Global rank of the same (dp, tp) position on the next stage, or None."""
        return None if self.is_last_stage else self.pp_ranks[self.pp_rank + 1]

    def destroy(self) -> None:
        """Destroy the groups this grid created (call on every rank)."""
        for group in self._groups:
            dist.destroy_process_group(group)
        self._groups.clear()

    def __repr__(self) -> str:
        return (f"ProcessGrid(rank={self.rank}, dp={self.dp}, pp={self.pp}, tp={self.tp}, "
                f"ep={self.ep}, pp_r={self.pp_rank}, dp_r={self.dp_rank}, tp_r={self.tp_rank})")
