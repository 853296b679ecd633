"""Sweeps in the store: create, end, results, export, and the API's reads.

The database is the single source of truth for a sweep's state; the runner, the CLI and the
API all go through these modules. Nothing here imports torch.

* :mod:`~sweeper.sweeps.stored`: a stored sweep (typed spec, grids, terminal states, loading);
* :mod:`~sweeper.sweeps.checks`: submission checks against the strategies' descriptors;
* :mod:`~sweeper.sweeps.search`: which hyperparameters each trial of a grid runs;
* :mod:`~sweeper.sweeps.planning`: check a spec, load its data, plan every grid (imports the
  workers' loaders, so only the paths that plan import it);
* :mod:`~sweeper.sweeps.quota`: a sweep's kept models against its tenant's quota;
* :mod:`~sweeper.sweeps.create`: plan, store and reserve a sweep;
* :mod:`~sweeper.sweeps.lifecycle`: cancel, fail, find one to resume;
* :mod:`~sweeper.sweeps.deletion`: delete an ended sweep and its kept models (never its spend);
* :mod:`~sweeper.sweeps.events`: the sweep's event log (live streams);
* :mod:`~sweeper.sweeps.released`: what may be released (papernot-steinke secrecy), and the
  release log's entries of completed papernot-steinke searches;
* :mod:`~sweeper.sweeps.results`: best per arm and level, Pareto fronts (pure);
* :mod:`~sweeper.sweeps.summary` and :mod:`~sweeper.sweeps.export`: what users are shown;
* :mod:`~sweeper.sweeps.sweep_pages`,
  :mod:`~sweeper.sweeps.trial_pages`, :mod:`~sweeper.sweeps.trial_detail`: the API's reads.
"""
