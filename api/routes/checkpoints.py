"""``/api/v1/checkpoints``: the checkpoints a spec's model may start from.

A spec's ``model.checkpoint`` names one of these (a server never takes a path): each with its
kind, its content digest (what a sweep pins in its stored spec) and its registration's
declaration (the public data it was trained on; that it has seen no private record). Any
signed-in user may read it; it holds no path and nothing private. The operator registers
checkpoints on the server's machine (``dpsweep checkpoints register``); registration over REST
is not offered.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool

from api.deps import SettingsDep
from api.errors import problem_responses
from api.registry_schemas import CheckpointsOut
from sweeper.sweeps.checkpoints import checkpoint_rows

router = APIRouter(tags=["checkpoints"])


@router.get(
    "/checkpoints",
    response_model=CheckpointsOut,
    responses=problem_responses(401),
    summary="Registered checkpoints: names, kinds, digests and what they were trained on",
)
async def checkpoints(settings: SettingsDep) -> Any:
    # The digests read every file of every checkpoint: off the event loop.
    rows = await run_in_threadpool(checkpoint_rows, settings.checkpoints_dir)
    return {"checkpoints": rows}
