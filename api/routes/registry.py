"""``/api/v1/registry``: every registered model, dataset loader, strategy and accountant.

Names and their torch-free descriptions (options with kind, default, range and help), the
installed plug-ins' included: what a spec may name. Any valid token may read it (it holds no
private data). The API resolves registered names only; it never imports a ``module:function``
string from a request (:mod:`workers.plugins`).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool

from api.errors import problem_responses
from api.schemas import RegistryOut
from workers.listing import registry_listing

router = APIRouter(tags=["registry"])


@router.get(
    "/registry",
    response_model=RegistryOut,
    responses=problem_responses(401),
    summary="Registered models, datasets, strategies and accountants (plug-ins included)",
)
async def registry() -> Any:
    # The first listing may load plug-ins (imports): off the event loop.
    return await run_in_threadpool(registry_listing)
