"""Lipschitz networks for clipless DP-SGD (002, Béthune et al., Algorithm 1).

A Lipschitz network has a per-sample gradient norm that can be bounded from its weights alone, so
DP-SGD needs no per-sample gradient norms and no clipping: the ``lipschitz`` strategy
(:mod:`workers.strategies.lipschitz`) releases the plain sum of per-sample gradients with noise
scaled to the bound computed here.

* :mod:`workers.lipschitz.layers`: the parameter-free layers (``InputBall``, ``GroupSort``,
  ``LogitScale``) and their packed versions;
* :mod:`workers.lipschitz.spectral`: certified upper bounds on spectral norms;
* :mod:`workers.lipschitz.bound`: the network's per-sample gradient bound (the sensitivity)
  and the projection that keeps every linear layer 1-Lipschitz;
* :mod:`workers.lipschitz.rounding`: the floating-point error bounds they rely on.

The models themselves are ``lip_mlp`` (:mod:`workers.models.lip_mlp`) and ``lip_cnn``
(:mod:`workers.models.lip_cnn`, bias-free convolutions; the bound for convolutions is in
:mod:`workers.lipschitz.bound`).

The loss is softmax cross-entropy, whose gradient w.r.t. the logits is ``softmax(z) - onehot(y)``
with norm at most ``sqrt(2)``: ``||p - e_y||^2 = (1 - p_y)^2 + sum_{j != y} p_j^2 <=
2 (1 - p_y)^2 <= 2``.
"""
