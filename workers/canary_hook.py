"""What the engine needs of an audit's gradient canaries: a protocol beside the engine.

The engine (:mod:`workers.engine`) and the trainer (:mod:`workers.training`) type the canaries
they are handed against this protocol, so that neither imports the audit
(:mod:`workers.canary_audit`), which imports the trainer to train with canaries: the arrows
point one way, audit -> trainer -> engine -> this protocol.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from torch import Tensor


class GradientCanaryHook(Protocol):
    """Records whose gradients the auditor chose; the included ones are sampled as records."""

    @property
    def n_included(self) -> int:
        """How many canaries are in the training set (records ``N..N+n_included-1``)."""
        ...

    ids_in: Tensor
    #: The adversary knows every other record (public data): the engine hands
    #: :meth:`observe` the data's expected contribution to subtract.
    knows_data: bool
    #: On data with a privacy unit: the rows of each canary unit (every one carries the
    #: canary's gradient; :mod:`workers.unit_canaries`).
    unit_rows: int

    def choose_norm(self, strategy: Any, ctx_cls: Any, *, sensitivity: Tensor, ctx: Any) -> Tensor:
        """Per trial, the canaries' raw gradient norm ``[K]``."""
        ...

    def slot_norms(self, raw_norm: Tensor, canary_ids: Tensor) -> Tensor:
        """The per-layer squared norms of the sampled canaries' slots."""
        ...

    def add_into(
        self, buf: Tensor, weights: Tensor, slots: Tensor, canary_ids: Tensor, raw_norm: Tensor
    ) -> None:
        """Add the sampled canaries' weighted gradients into the clipped sum ``buf``."""
        ...

    def place_rows(
        self,
        grads: Tensor,
        slots: Tensor,
        canary_ids: Tensor,
        raw_norm: Tensor,
        columns: Sequence[Sequence[tuple[int, int]]],
    ) -> None:
        """Write the sampled canary rows' gradients into dense per-row gradients (``capped``)."""
        ...

    def observe(
        self,
        grad_release: Tensor,
        *,
        noise_std: Tensor,
        expected_batch_size: float,
        predicted: Tensor | None = None,
    ) -> None:
        """Record the adversary's view of one step's noised release."""
        ...
