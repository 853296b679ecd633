"""The fixed sentences a model card carries: its warnings and the notes that say what a figure
is (a single run's epsilon, the seed, the record identity, the selected trial, the split).

Shared by the card (:mod:`sweeper.artifacts.cards`) and its Markdown rendering
(:mod:`sweeper.artifacts.card_markdown`); a card stores them, so changing one changes the bytes
of every card written after.
"""

from __future__ import annotations

NOT_PRIVATE_WARNING = (
    "not differentially private: this model was trained without DP noise, so it may reveal "
    "its training records; no epsilon applies to it"
)
SINGLE_RUN_NOTE = (
    "what this run alone would cost, were it the only release; not what was spent: the "
    "grid's epsilon covers the release this model belongs to"
)
SEED_SECRET = (
    "public seed: it seeds the initial weights and the evaluation diagnostics only; the "
    "Poisson batches and the noise came from a fresh per-trial secret that was never stored"
)
SEED_REPRODUCIBLE = (
    "public seed: it seeds the initial weights and also the Poisson batches and the noise "
    "(reproducible mode): anyone who knows it can reproduce them"
)
IDENTITY_NOTE = (
    "the identity of the records (a hash of every record) is not on the card: someone who "
    "knows all records but one could test guesses of the last against it; the operator sees "
    "it with `dpsweep datasets show NAME`"
)
SELECTED_NOTE = (
    "papernot-steinke: this model is its grid's selected trial, the only one the random "
    "search releases; the grid's epsilon covers releasing it, and the number of runs stays "
    "secret (so the card has no position, timestamps or durations)"
)


SPLIT_METHODS = {
    "carve-out": (
        "a shuffle seeded by split_seed (sklearn's train_test_split, stratified by class when "
        "every class can appear on both sides) holds out round(n * test_fraction) records as "
        "the evaluation split (treated as public)"
    ),
    "dp": (
        "each record's content is hashed with split_seed as the key; the records whose hash "
        "falls below test_fraction are the evaluation split (kept private: its metrics are "
        "noisy)"
    ),
    "public": (
        "every record of the dataset trains; the evaluation records are all those of "
        "eval_dataset, declared public by its owner (split_seed and test_fraction are unused)"
    ),
}
CLASSES_NOTE = (
    "null: labels are encoded as the records' sorted distinct labels (a built-in or a local "
    "file); a list: the class list the dataset's owner declared, in encoding order"
)
SPLIT_CHECK = (
    "`dpsweep model TRIAL --check` rebuilds this split with the workers' loading code and "
    "re-evaluates the model on it"
)

CHECKPOINT_DECLARED = (
    "its registration declares that these starting weights were trained on public data "
    "({trained_on}) and have seen none of the private records: the frozen weights are then a "
    "public input of this release, and cost no epsilon"
)
CHECKPOINT_UNDECLARED = (
    "a local checkpoint (a path on the command line, not registered): no registration "
    "declares what it was trained on; the epsilon holds only if it has seen none of the "
    "private records"
)
FROZEN_NOTE = (
    "frozen parameters were neither clipped nor noised; the epsilon is that of the trained "
    "ones, the same as if every parameter were trained (the frozen values do not depend on the "
    "private records)"
)


__all__ = [
    "CHECKPOINT_DECLARED",
    "CHECKPOINT_UNDECLARED",
    "CLASSES_NOTE",
    "FROZEN_NOTE",
    "IDENTITY_NOTE",
    "NOT_PRIVATE_WARNING",
    "SEED_REPRODUCIBLE",
    "SEED_SECRET",
    "SELECTED_NOTE",
    "SINGLE_RUN_NOTE",
    "SPLIT_CHECK",
    "SPLIT_METHODS",
]
