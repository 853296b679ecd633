"""Trained models a sweep keeps: the artifact store, the keeping policy, model cards, reads.

* :mod:`sweeper.artifacts.keeper` — which trained models the driver keeps (the spec's
  ``artifacts.keep``), staged with their trial's result and then written to the store;
* :mod:`sweeper.artifacts.cards` — the model card beside each model;
* :mod:`sweeper.artifacts.reads` — what an owner may read back;

Where the bytes live (a local directory, by default next to the SQLite file, or any fsspec URL;
written under a temporary name, then renamed) is the store layer's
:mod:`sweeper.store.artifact_files`, and a listing's model reference is
:mod:`sweeper.store.model_refs`, so that the sweeps layer can delete and list models without
importing this one. The quota check at creation is :mod:`sweeper.sweeps.quota`.
"""
