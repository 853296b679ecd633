"""The next DP step's standard normal draws, made ahead on a background thread.

A DP step spends a large share of its time turning each trial's AES-CTR keystream into float64
standard normals (:func:`workers.polar.polar_rows`). Those draws do not depend on the step's
data: only on the trial's own noise stream and on how many draws the step asks for, which is
the same every step (the parameter count, once per release). :class:`NoiseAhead` therefore
makes step t+1's draws on one background thread while step t+1 samples its batch and runs the
forward and backward passes; the release then only scales, adds and snaps them
(:func:`workers.randomness.add_snapped_noise`, at the std of that step, so strategies whose std
changes every step are unaffected).

What stays exactly as in the sequential :class:`~workers.randomness.NoiseSource`:

* **The same values, from the same words, in the same order.** At the end of a step the source
  schedules, in order, one draw per request that step made, each from the trial's own stream
  (row k from stream k; nothing else is ever read). A request that matches the next draw made
  ahead gets it; the values are bit for bit those the sequential source gives.
* **A request the read-ahead did not foresee** (a different size, or more requests than last
  step) falls back to the sequential path: the draws made ahead and not used are undone first.
  The sampler leaves every keystream word it read untouched (``keep_words``), and the stream
  takes them back (:meth:`~workers.randomness.RandomStream.unread`), so it continues exactly
  as if they had never been read. The same holds for a step that asks for fewer draws, and at
  :meth:`NoiseAhead.close`.
* **The secret never leaves the process.** The thread reads the same in-process stream objects,
  and the source, like every holder of a stream, refuses to be pickled.

The thread's errors surface in the step that uses the draw (``Future.result``); a source whose
read-ahead failed refuses further draws, because its streams' positions are then unknown.
:meth:`NoiseAhead.close` (the training loop calls it in ``finally``) undoes what was not used
and joins the thread. It is opt-in, ``DPSWEEP_NOISE_AHEAD=1``
(:class:`workers.settings.WorkerSettings`): a pack then keeps one more core busy than Ray was
asked for, which pays only with an idle core beside each pack.

The work in the thread runs in parallel with the training thread: the AES call of
``cryptography`` (>= 45) and numpy's ufuncs, ``take`` and ``nonzero`` on arrays of this size
release the GIL, as do torch's kernels and autograd on the training thread.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, NoReturn

import numpy as np

from workers.polar import Workspace, polar_rows
from workers.randomness import NoiseSource, RandomStream, _never_pickled, add_snapped_noise

if TYPE_CHECKING:
    import torch
    from torch import Tensor

THREAD_NAME = "dpsweep-noise-ahead"


class _Recorder:
    """One stream as the sampler reads it, remembering the words it gave (views, not copies:
    with ``keep_words`` the sampler leaves them as they were read)."""

    __slots__ = ("stream", "words")

    def __init__(self, stream: RandomStream) -> None:
        self.stream = stream
        self.words: list[np.ndarray] = []

    def __reduce__(self) -> NoReturn:
        _never_pickled("a noise read-ahead")

    def words_into(self, out: np.ndarray, n: int) -> None:
        self.stream.words_into(out, n)
        self.words.append(out.reshape(-1)[:n])


class _Slot:
    """The buffers of the j-th draw of a step: its own, so the words of every draw made ahead
    stay intact until that draw is used or undone."""

    def __init__(self) -> None:
        self.ws = Workspace()
        self.out = np.empty((0, 0))


@dataclass
class _Ahead:
    """One draw made (or being made) ahead."""

    n: int
    recorders: list[_Recorder]
    future: Future[np.ndarray]


class NoiseAhead(NoiseSource):
    """A :class:`~workers.randomness.NoiseSource` that makes the next step's draws ahead.

    The engine calls :meth:`step_done` after each step; whoever owns the source calls
    :meth:`close` when training ends (also on errors). Draws are identical to the sequential
    source's, request by request (see the module docstring).
    """

    def __init__(self, streams: Sequence[RandomStream], device: torch.device | str) -> None:
        super().__init__(streams, device)
        self._sizes: list[int] = []  # the requests of the running step, in order
        self._ahead: deque[_Ahead] = deque()
        self._slots: list[_Slot] = []
        self._pool: ThreadPoolExecutor | None = None  # started at the first step's end
        self._closed = False
        self._failed: BaseException | None = None

    def __reduce__(self) -> NoReturn:
        _never_pickled("a NoiseAhead")

    def standard_normal(self, n: int) -> Tensor:
        """``[K, n]`` draws: the next ones made ahead if they have this size, else sequential.

        On CPU the tensor is a view of a buffer that is reused at the end of the step: use it
        at once (as with the sequential source).
        """
        self._check()
        if self._ahead:
            if self._ahead[0].n == n:
                item = self._ahead.popleft()
                try:
                    z = item.future.result()
                except BaseException as e:
                    self._failed = e
                    raise
                self._sizes.append(n)
                return self._tensor(z)
            self._undo()  # not what was foreseen: undo the read-ahead, then draw as usual
        self._sizes.append(n)
        return super().standard_normal(n)

    def add_noise(self, buf: Tensor, std: Tensor) -> Tensor:
        """As the sequential source's, from the draws made ahead (so never fused)."""
        return add_snapped_noise(buf, self.standard_normal(buf.shape[1]), std)

    def step_done(self) -> None:
        """Schedule the next step's draws: one per request of this step, in the same order."""
        if self._closed or self._failed is not None:
            return
        if self._ahead:  # this step used fewer draws than were made ahead
            self._undo()
        sizes, self._sizes = self._sizes, []
        if not sizes:
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=THREAD_NAME)
        while len(self._slots) < len(sizes):
            self._slots.append(_Slot())
        # One worker runs the draws in order, so each stream is read in the order of the
        # requests, as the sequential source reads it.
        for n, slot in zip(sizes, self._slots, strict=False):
            recorders = [_Recorder(s) for s in self.streams]
            future = self._pool.submit(_draw, recorders, n, slot)
            self._ahead.append(_Ahead(n, recorders, future))

    def close(self) -> None:
        """Undo the draws made ahead and not used, and join the thread (idempotent).

        The source stays usable, sequentially. A failure in a draw that was never used is
        dropped with that draw (it changed no result), but the source then refuses to draw.
        """
        if self._closed:
            return
        self._closed = True
        try:
            if self._ahead:
                self._undo()
        except BaseException as e:
            self._failed = e
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True, cancel_futures=True)
                self._pool = None

    def __enter__(self) -> NoiseAhead:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check(self) -> None:
        if self._failed is not None:
            raise RuntimeError(
                "the noise read-ahead failed; its streams' positions are unknown"
            ) from self._failed

    def _undo(self) -> None:
        """Give back the words of every draw made ahead and not used; the streams continue as
        if they had not been read."""
        items = list(self._ahead)
        self._ahead.clear()
        # Last first: a draw that never started never read its streams, and then neither did
        # any after it (one worker, in order), so the draws that ran are a prefix.
        for item in reversed(items):
            item.future.cancel()
        ran = [item for item in items if not item.future.cancelled()]
        for item in ran:
            error = item.future.exception()  # waits for a running draw
            if error is not None:
                self._failed = error
                raise error
        for r, stream in enumerate(self.streams):
            words = [w for item in ran for w in item.recorders[r].words]
            if words:
                stream.unread(words)


def _draw(recorders: list[_Recorder], n: int, slot: _Slot) -> np.ndarray:
    """Row k: ``n`` standard normals from stream k (on the background thread)."""
    if slot.out.shape[1] < n or slot.out.shape[0] != len(recorders):
        slot.out = np.empty((len(recorders), n))
    z = slot.out[:, :n]
    polar_rows(recorders, n, z, slot.ws, keep_words=True)
    return z


__all__ = ["THREAD_NAME", "NoiseAhead"]
