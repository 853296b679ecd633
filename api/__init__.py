"""dpsweep REST API (FastAPI), the dashboard, the CLI and the test harness: the outer layer.

Layers, top first; each imports only the ones below it and nothing imports ``api``:
``api`` > ``sweeper`` (the domain; its sub-packages are layered too, see its docstring) >
``workers`` (tensors, never the database) > ``dpsweep`` (spec models, errors, the SDK).
``tests/test_import_graph.py`` checks the order and that there is no import cycle.
"""
