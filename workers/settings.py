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
