"""Settings of a worker process (pydantic-settings, environment prefix ``DPSWEEP_``)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class WorkerSettings(BaseSettings):
    """What a worker may use. ``DPSWEEP_PACK_MEMORY_MB=512`` etc. override the defaults."""

    model_config = SettingsConfigDict(env_prefix="DPSWEEP_", extra="ignore")

    pack_memory_mb: float = Field(
        default=2048.0, gt=0, description="memory budget of one pack (estimated), in MiB"
    )
    max_pack_size: int = Field(default=64, ge=1, description="most trials in one pack")
    threads: int = Field(default=1, ge=1, description="CPU threads per pack")
    device: str = Field(default="auto", description="auto, cpu or cuda")
    # Off by default: on a CPU host running one pack per core the extra thread oversubscribes
    # the cores (Ray is asked for `threads` CPUs per pack), and measured under load it made
    # steps slower as often as faster. Worth it with an idle core beside each pack.
    noise_ahead: bool = Field(
        default=False,
        description=(
            "make the next DP step's noise draws on a second thread during the current step "
            "(identical draws; a pack then keeps one more core busy: DPSWEEP_NOISE_AHEAD=1)"
        ),
    )
    checkpoints_dir: str = Field(
        default="./dpsweep-checkpoints",
        description=(
            "where registered checkpoints live (one subdirectory per name, with its manifest "
            "dpsweep-checkpoint.json): DPSWEEP_CHECKPOINTS_DIR"
        ),
    )
    # Public pre-training's weights (workers.pretraining), one file per digest of their inputs:
    # public records only, so the directory holds nothing private. Empty: <data cache>/pretrained.
    pretrain_cache: str = Field(
        default="",
        description=(
            "where public pre-training (model.pretrain_on) keeps its weights, one file per "
            "digest of their inputs, reused by later trials and sweeps: DPSWEEP_PRETRAIN_CACHE "
            "(default: pretrained/ under DPSWEEP_DATA_CACHE)"
        ),
    )
