"""The sweep driver: the loop, the Ray backend, packs, claim-and-charge, crash policy, progress.

* :mod:`.loop`: :class:`~.loop.SweepRunner` and :func:`~.loop.run_sweep`, the driver's loop.
* :mod:`.held_sweep`: the sweep a driver holds (typed spec and plan, queue, packs in flight).
* :mod:`.liveness`: taking a sweep over, the heartbeat, giving a sweep up.
* :mod:`.ray_backend`: Ray init, the pack task, submit, wait, kill.
* :mod:`.packs`: :func:`~.packs.pack_spec` (what a worker trains) and pack formation.
* :mod:`.claims`: claim-and-charge, and ending a trial.
* :mod:`.crash`: the one crash policy (a dead driver's trials, a lost worker's pack).
* :mod:`.pack_events`: what a running pack streams back, written to the database.
* :mod:`.tpe`: the TPE adapter (ask/tell).
* :mod:`.progress`: counts, bests, ETA, the last event; a driver's outcome.
* :mod:`.scheduler`: drives the sweeps the database says are waiting.
"""
