"""Training a pack of trials: what is asked and returned (:mod:`workers.training.specs`), the
loop (:mod:`workers.training.loop`) and the evaluation of checkpoints
(:mod:`workers.training.evaluation`). Import from the submodules."""
