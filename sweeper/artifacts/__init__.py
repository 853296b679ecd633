"""Trained models a sweep keeps: the artifact store, the keeping policy, model cards, reads.

* :mod:`sweeper.artifacts.store` — where the bytes live: a local directory (by default next to
  the SQLite file) or any fsspec URL; written under a temporary name, then renamed;
* :mod:`sweeper.artifacts.keeper` — which trained models the driver keeps (the spec's
  ``artifacts.keep``), staged with their trial's result and then written to the store;
* :mod:`sweeper.artifacts.cards` — the model card beside each model;
* :mod:`sweeper.artifacts.reads` — what an owner may read back;
* :mod:`sweeper.artifacts.quota` — the bytes each tenant keeps, against its quota.
"""
