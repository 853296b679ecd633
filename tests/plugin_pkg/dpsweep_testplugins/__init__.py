"""dpsweep test plug-ins: one of each kind, each registered through its entry point.

* ``testplug-clip`` (:mod:`.strategy`): fixed clipping whose weights are scaled down by
  ``shrink`` (sensitivity ``C``, unchanged; a strategy with a hyperparameter of its own).
* ``testplug-mlp`` (:mod:`.model`): a one-hidden-layer MLP with a ``width`` option.
* ``testplug-rdp`` (:mod:`.accountant`): dp_accounting's RDP under another name.
* ``testplug-ssv`` (:mod:`.dataset`): semicolon-separated values (``.ssv``), registerable.

Names are module constants so that tests refer to them, not to copies of the strings.
"""

from __future__ import annotations

STRATEGY = "testplug-clip"
MODEL = "testplug-mlp"
ACCOUNTANT = "testplug-rdp"
DATASET_FORMAT = "testplug-ssv"
