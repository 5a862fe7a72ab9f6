"""Names the trainers' own configurations use for paraplan's settings, shared by the exporters
and the importers (each cited to the trainer's source)."""

from __future__ import annotations

MEGATRON_FP8_RECIPES = {"delayed": "delayed", "tensorwise": "current", "blockwise": "block",
                        "mxfp8": "block"}
"""Megatron-Core's ``--fp8-recipe`` choices (core_v0.15.3 arguments.py; default ``delayed``)
-> ``TrainingSpec.fp8_scaling``; the first name of each is written on export (block scaling
as ``blockwise``; ``mxfp8``, Blackwell's MX format, is priced alike)."""

MEGATRON_FSDP_SHARDING = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}
"""Megatron-FSDP's ``--data-parallel-sharding-strategy`` -> ZeRO stage (import; ZeRO-2/3 export)."""

TORCHTITAN_ROTATE_METHODS = {"allgather": "allgather", "alltoall": "ring"}
"""torchtitan's ``parallelism.context_parallel_rotate_method`` -> ``TrainingSpec.cp_kv_exchange``
(v0.2.2 job_config.py: 'alltoall' shuffles each K/V shard to the next rank, a ring step)."""
