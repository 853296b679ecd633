"""The clipping strategies of the papers: weights, sensitivities, updates, noise split, BAM pass."""

from __future__ import annotations

import math

import pytest
import torch

from dpsweep.errors import ConfigError
from tests.workers.packed.test_per_sample import packed_infos, reference_per_sample
from tests.workers.streams import noise_stream, sample_stream
from workers.accounting import calibrate_noise_multiplier
from workers.datasets.loading import load_dataset
from workers.datasets.records import DatasetSpec
from workers.engine import DPEngine
from workers.models import ModelSpec, build_model
from workers.optim import PackedOptimizer
from workers.packed import PackedModel
from workers.schedule import plan_steps
from workers.strategies import NoiseSource, StepContext, get_strategy
from workers.training.loop import train_trial
from workers.training.specs import PackSpec, TrialSpec

K, B, L = 2, 6, 3


def fixed_norms() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    layer_norms = torch.rand(K, B, L, generator=gen) * 2.0
    layer_norms[0, 0] = 0.0  # a zero gradient
    mask = torch.ones(K, B)
    mask[1, -2:] = 0.0  # padding
    return layer_norms.pow(2), mask


def make(name: str, params: list[dict], b: float = 4.0):  # type: ignore[no-untyped-def]
    strat = get_strategy(name)(params, n_layers=L, device=torch.device("cpu"))
    strat.bind(None, expected_batch_size=b, task="classification")  # type: ignore[arg-type]
    return strat


def ctx_for(sq: torch.Tensor, mask: torch.Tensor, b: float = 4.0) -> StepContext:
    return StepContext(
        sq_norms=sq, mask=mask, expected_batch_size=b, noise=NoiseSource([], torch.device("cpu"))
    )


# ---------------------------------------------------------------------------------------------
# Weights and sensitivity against hand computations on fixed norms.


@pytest.mark.parametrize("style", ["flat", "layerwise"])
def test_fixed_and_automatic_weights(style: str) -> None:
    sq, mask = fixed_norms()
    n_flat = sq.sum(-1).sqrt()
    for name in ("fixed", "automatic"):
        s = make(name, [{"clip": 0.5, "clip_style": style}, {"clip": 2.0, "clip_style": style}])
        res = s.clip(ctx_for(sq, mask))
        assert res.sensitivity.tolist() == [0.5, 2.0]
        for k, c in enumerate((0.5, 2.0)):
            for i in range(B):
                m = mask[k, i].item()
                if style == "flat":
                    n = n_flat[k, i].item()
                    want = (
                        (min(1.0, c / n) if n > 0 else 1.0) if name == "fixed" else c / (n + 0.01)
                    )
                    assert res.weights[k, i, 0].item() == pytest.approx(m * want, rel=1e-6)
                else:
                    cr = c / math.sqrt(L)
                    for r in range(L):
                        n = sq[k, i, r].sqrt().item()
                        if name == "fixed":
                            want = min(1.0, cr / n) if n > 0 else 1.0
                        else:
                            want = cr / (n + 0.01)
                        assert res.weights[k, i, r].item() == pytest.approx(m * want, rel=1e-6)
        # Every weighted per-example gradient stays within the sensitivity.
        w = res.weights
        contrib = (w.pow(2) * (sq if style == "layerwise" else sq.sum(-1, keepdim=True))).sum(-1)
        assert (contrib.sqrt() <= res.sensitivity.unsqueeze(1) * (1 + 1e-6)).all()


def test_global_weights() -> None:
    sq, mask = fixed_norms()
    n = sq.sum(-1).sqrt()
    s = make(
        "global", [{"clip": 1.0, "global_threshold": 1.5}, {"clip": 0.3, "global_threshold": 2.0}]
    )
    res = s.clip(ctx_for(sq, mask))
    for k, (c, z) in enumerate(((1.0, 1.5), (0.3, 2.0))):
        want = torch.where(n[k] <= z, torch.tensor(c / z), torch.tensor(0.0)) * mask[k]
        torch.testing.assert_close(res.weights[k, :, 0], want)
    assert res.sensitivity.tolist() == pytest.approx([1.0, 0.3])


def test_quantile_weights_count_and_split() -> None:
    sq, mask = fixed_norms()
    n = sq.sum(-1).sqrt()
    s = make("quantile", [{"clip_init": 1.2}, {"clip_init": 0.7, "count_noise": 3.0}], b=40.0)
    res = s.clip(ctx_for(sq, mask, b=40.0))
    for k, c in enumerate((1.2, 0.7)):
        want_w = torch.where(n[k] > 0, torch.clamp(c / n[k], max=1.0), torch.ones(B)) * mask[k]
        torch.testing.assert_close(res.weights[k, :, 0], want_w)
        want_count = ((n[k] <= c).float() - 0.5) * mask[k]
        torch.testing.assert_close(res.scalars[0].values[k], want_count)
    assert res.sensitivity.tolist() == pytest.approx([1.2, 0.7])
    count = res.scalars[0]
    assert count.sensitivity.tolist() == [0.5, 0.5]
    # sigma_b defaults to b/20 = 2; the count's multiplier is 2 sigma_b (std sigma_b).
    assert count.noise_multiplier.tolist() == pytest.approx([4.0, 6.0])


def test_online_weights_and_directions() -> None:
    sq, mask = fixed_norms()
    n = sq.sum(-1).sqrt()
    s = make("online", [{"clip_init": 0.9}, {"clip_init": 1.4}])
    s.gradient_noise_multiplier(torch.tensor([1.0, 2.0]))
    res = s.clip(ctx_for(sq, mask))
    for k, c in enumerate((0.9, 1.4)):
        want_w = torch.where(n[k] > 0, torch.clamp(c / n[k], max=1.0), torch.ones(B)) * mask[k]
        torch.testing.assert_close(res.weights[k, :, 0], want_w)
        want_u = torch.where(n[k] > c, 1.0 / n[k], torch.zeros(B)) * mask[k]
        torch.testing.assert_close(res.extra[0].weights[k, :, 0], want_u)
        # sum w_i g_i = sum_{n<=C} g_i + C sum q_i: the two queries share one set of norms.
        torch.testing.assert_close(want_w, torch.where(n[k] <= c, 1.0, c * want_u) * mask[k])
    assert res.extra[0].sensitivity.tolist() == [1.0, 1.0]
    assert res.extra[0].noise_multiplier.tolist() == pytest.approx([7.124, 14.248])


def test_bam_ascent_scale() -> None:
    sq, mask = fixed_norms()
    n = sq.sum(-1).sqrt()
    s = make("bam", [{"bam_lambda": 0.2}, {"bam_lambda": 0.05}])
    scale = s.ascent_scale(ctx_for(sq, mask))
    assert scale is not None
    want = torch.where(
        n > 0, torch.tensor([[0.2], [0.05]]) / n.clamp(min=1e-30), torch.zeros_like(n)
    )
    torch.testing.assert_close(scale, want)


# ---------------------------------------------------------------------------------------------
# The noise split is exact: the joint release costs one Gaussian of multiplier sigma.


@pytest.mark.parametrize("name,params", [("quantile", {"count_noise": 3.0}), ("online", {})])
def test_noise_split_is_exact(name: str, params: dict) -> None:
    sigma = torch.tensor([0.8, 2.5])
    s = make(name, [params, params], b=60.0)
    sigma_g = s.gradient_noise_multiplier(sigma)
    second = 2.0 * torch.tensor(3.0) if name == "quantile" else 7.124 * sigma
    effective = (sigma_g.pow(-2) + second.pow(-2)).pow(-0.5)
    torch.testing.assert_close(effective, sigma, rtol=1e-6, atol=0)
    if name == "online":  # 7.124 is chosen so the gradient gets about 1 % more noise
        assert ((sigma_g / sigma - 1.0).abs() - 0.01).abs().max() < 1e-3


@pytest.mark.parametrize("name", ["quantile", "online"])
def test_measured_release_noise_matches_the_split(name: str) -> None:
    """Drive the real engine on empty batches: every release is pure noise, measured."""
    torch.manual_seed(0)
    module = build_model(ModelSpec("logreg"), input_shape=(50,), num_classes=20, seed=0)
    model = PackedModel([module])
    x, y = torch.randn(10, 50), torch.randint(20, (10,))
    sigma, c0 = 1.3, 0.7
    params = (
        {"clip_init": c0, "clip_lr": 1e-12}
        if name == "quantile"
        else {"clip_init": c0, "clip_lr": 1e-12, "lr_lr": 1e-12}
    )
    if name == "quantile":
        params["count_noise"] = 2.0
    strat = get_strategy(name)([params], n_layers=1, device=model.device)
    q = 1e-9
    engine = DPEngine(
        model=model,
        strategy=strat,
        optimizer=PackedOptimizer("sgd", torch.tensor([0.0 + 1e-30])),
        x=x,
        y=y,
        task="classification",
        sample_rate=q,
        noise_multiplier=torch.tensor([sigma]),
        sample_streams=[sample_stream(1)],
        noise=NoiseSource([noise_stream(2)], model.device),
    )
    b = q * len(x)
    grads, seconds = [], []
    for _ in range(300):
        releases = engine._releases(*engine.sample())
        grads.append(releases["grad"][0].clone())
        seconds.append(releases["count" if name == "quantile" else "direction"][0].clone())
    g = torch.stack(grads) * b / c0  # noise in units of the gradient's sensitivity
    measured_g = g.std().item()
    if name == "quantile":
        measured_2 = (torch.stack(seconds) * b / 0.5).std().item()  # count sensitivity 1/2
    else:
        measured_2 = (torch.stack(seconds) * b / 1.0).std().item()  # unit sensitivity
    effective = (measured_g**-2 + measured_2**-2) ** -0.5
    assert effective == pytest.approx(sigma, rel=0.03)


def test_quantile_refuses_a_split_that_leaves_no_gradient_budget() -> None:
    s = make("quantile", [{"count_noise": 0.5}])
    with pytest.raises(
        ConfigError, match=r"noise multiplier 1.5 is >= 2\*sigma_b = 1.*count_noise"
    ):
        s.gradient_noise_multiplier(torch.tensor([1.5]))


# ---------------------------------------------------------------------------------------------
# Adaptive updates with the noise off.


@pytest.mark.parametrize("gamma", [0.1, 0.5, 0.9])
def test_quantile_converges_to_the_target_quantile(gamma: float) -> None:
    gen = torch.Generator().manual_seed(3)
    norms = torch.exp(torch.randn(1, 2000, generator=gen))  # log-normal norms
    sq = norms.pow(2).unsqueeze(-1)
    mask = torch.ones(1, 2000)
    s = make("quantile", [{"target_quantile": gamma, "clip_init": 0.1, "clip_lr": 0.2}], b=2000.0)
    for _ in range(400):
        res = s.clip(ctx_for(sq, mask, b=2000.0))
        s.observe({"count": res.scalars[0].values.sum(dim=1) / 2000.0}, None)  # type: ignore[arg-type]
    target = torch.quantile(norms[0], gamma).item()
    assert s.clip_norm.item() == pytest.approx(target, rel=0.05)


def test_online_sign_rules_follow_the_derivation() -> None:
    s = make("online", [{"clip_init": 0.5, "clip_lr": 0.1, "lr_lr": 0.1}])
    s.gradient_noise_multiplier(torch.tensor([1.0]))
    e1, e2 = torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 1.0]])
    s.observe({"grad": e1, "direction": e1}, None)  # type: ignore[arg-type]  # t = 1: no update
    assert s.clip_norm.item() == 0.5 and s.lr_scale().item() == 1.0  # type: ignore[union-attr]
    # The new gradient agrees with the last step's gradient and with the directions of the
    # clipped examples: dL/dC = -rho g~_t . q~_{t-1} < 0 and dL/drho = -g~_t . g~_{t-1} < 0,
    # so descent raises both C and the learning rate.
    s.observe({"grad": e1 + 0.1 * e2, "direction": e1}, None)  # type: ignore[arg-type]
    assert s.clip_norm.item() == pytest.approx(0.5 * math.exp(0.1))
    assert s.lr_scale().item() == pytest.approx(math.exp(0.1))  # type: ignore[union-attr]
    # Overshooting: the gradient flips sign, so both shrink.
    s.observe({"grad": -e1, "direction": -e1}, None)  # type: ignore[arg-type]
    assert s.clip_norm.item() == pytest.approx(0.5)
    assert s.lr_scale().item() == pytest.approx(1.0)  # type: ignore[union-attr]


def test_online_grows_c_and_lr_on_a_consistent_problem() -> None:
    """Real engine, noise negligible: separable data, C_0 far below the norms, small lr.

    Every example is clipped and all gradients point the same way, so C and lr must rise.
    """
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(400, 5, generator=gen) * 4.0
    y = (x[:, 0] > 0).long()
    module = build_model(ModelSpec("logreg"), input_shape=(5,), num_classes=2, seed=0)
    model = PackedModel([module])
    strat = get_strategy("online")(
        [{"clip_init": 1e-3, "clip_lr": 0.05, "lr_lr": 0.05}], n_layers=1, device=model.device
    )
    engine = DPEngine(
        model=model,
        strategy=strat,
        optimizer=PackedOptimizer("sgd", torch.tensor([1e-3])),
        x=x,
        y=y,
        task="classification",
        sample_rate=0.25,
        noise_multiplier=torch.tensor([1e-6]),
        sample_streams=[sample_stream(1)],
        noise=NoiseSource([noise_stream(2)], model.device),
    )
    for _ in range(20):
        engine.step()
    assert strat.clip_norm.item() == pytest.approx(1e-3 * math.exp(0.05 * 19), rel=1e-4)
    assert strat.lr_scale().item() == pytest.approx(math.exp(0.05 * 19), rel=1e-4)  # type: ignore[union-attr]


# ---------------------------------------------------------------------------------------------
# BAM's second pass: gradients at theta + lambda g_i / ||g_i||, example by example.


@pytest.mark.parametrize(
    "name,shape", [("mlp", (7,)), ("cnn", (1, 9, 9)), ("autoencoder", (1, 6, 6))]
)
def test_bam_gradients_are_taken_at_the_perturbed_points(name: str, shape: tuple[int, ...]) -> None:
    torch.manual_seed(1)
    lam = 0.3
    module = build_model(ModelSpec(name), input_shape=shape, num_classes=3, seed=2)
    model = PackedModel([module])
    strat = get_strategy("bam")(
        [{"bam_lambda": lam}], n_layers=model.n_param_layers, device=model.device
    )
    task = "reconstruction" if name == "autoencoder" else "classification"
    x, y = torch.rand(4, *shape), torch.randint(3, (4,))
    engine = DPEngine(
        model=model,
        strategy=strat,
        optimizer=PackedOptimizer("sgd", torch.tensor([0.1])),
        x=x,
        y=y if task == "classification" else None,
        task=task,
        sample_rate=1.0,
        noise_multiplier=torch.tensor([1.0]),
        sample_streams=[sample_stream(1)],
        noise=NoiseSource([noise_stream(2)], model.device),
    )
    target = y.unsqueeze(0) if task == "classification" else x.unsqueeze(0)
    infos, sq, _ = engine.per_sample(x.unsqueeze(0), target, torch.ones(1, 4))
    got = model.per_sample_grads(infos)[0]
    assert sq is not None
    torch.testing.assert_close(sq[0].sum(-1), got.pow(2).sum(-1), rtol=1e-4, atol=1e-6)
    theta = model.flat[0].clone()
    g = reference_per_sample(module, x, y, task)
    for i in range(4):
        moved = model.to_module(0, theta + lam * g[i] / g[i].norm())
        want = reference_per_sample(moved, x[i : i + 1], y[i : i + 1], task)[0]
        torch.testing.assert_close(got[i], want, rtol=2e-3, atol=2e-5)


# ---------------------------------------------------------------------------------------------
# Diagnostics on the evaluation split.


def test_diagnostics_match_a_hand_computation_on_the_eval_batch() -> None:
    gen = torch.Generator().manual_seed(0)
    module = build_model(ModelSpec("mlp", {"hidden": [6]}), input_shape=(5,), num_classes=3, seed=0)
    model = PackedModel([module])
    strat = get_strategy("fixed")(
        [{"clip": 0.4}], n_layers=model.n_param_layers, device=model.device
    )
    x_train, y_train = torch.randn(30, 5, generator=gen) * 3, torch.randint(3, (30,), generator=gen)
    x_eval, y_eval = torch.randn(12, 5, generator=gen) * 3, torch.randint(3, (12,), generator=gen)
    engine = DPEngine(
        model=model,
        strategy=strat,
        optimizer=PackedOptimizer("sgd", torch.tensor([0.1])),
        x=x_train,
        y=y_train,
        task="classification",
        sample_rate=0.3,
        noise_multiplier=torch.tensor([1.0]),
        sample_streams=[sample_stream(1)],
        noise=NoiseSource([noise_stream(2)], model.device),
    )
    d = engine.diagnostics(x_eval, y_eval, [torch.Generator().manual_seed(5)])
    g = reference_per_sample(module, x_eval, y_eval, "classification")
    n = g.norm(dim=1, keepdim=True)
    true = g.mean(0)
    clipped = (torch.clamp(0.4 / n, max=1.0) * g).mean(0)
    assert d["frac_clipped"].item() == pytest.approx((n > 0.4).float().mean().item())
    assert d["clip_bias"].item() == pytest.approx((clipped - true).norm().item(), rel=1e-4)
    xi = torch.randn(clipped.numel(), generator=torch.Generator().manual_seed(5))
    private = clipped + 1.0 * 0.4 / (0.3 * 30) * xi
    cos = torch.nn.functional.cosine_similarity(private, true, dim=0).item()
    assert d["grad_cos"].item() == pytest.approx(cos, rel=1e-4)
    # Nothing about the private training split enters: replacing it changes nothing.
    engine.x = torch.zeros_like(x_train)
    d2 = engine.diagnostics(x_eval, y_eval, [torch.Generator().manual_seed(5)])
    assert all(torch.equal(d[k], d2[k]) for k in d)


# ---------------------------------------------------------------------------------------------
# Every strategy learns digits at epsilon = 8.

STRATEGY_RUNS = [
    ("fixed", {"clip": 1.0}, 1.0),
    ("automatic", {"clip": 1.0}, 1.0),
    ("automatic", {"clip": 1.0, "clip_style": "layerwise"}, 1.0),
    ("fixed", {"clip": 1.0, "clip_style": "layerwise"}, 1.0),
    ("global", {"clip": 1.0, "global_threshold": 30.0}, 2.0),
    ("quantile", {"target_quantile": 0.5}, 1.0),
    ("online", {"clip_init": 0.1}, 2.0),
    ("bam", {"clip": 1.0, "bam_lambda": 0.1}, 1.0),
]


@pytest.mark.parametrize("name,params,lr", STRATEGY_RUNS)
def test_every_strategy_learns_digits_at_epsilon_8(name: str, params: dict, lr: float) -> None:
    data = load_dataset(DatasetSpec("digits"))
    q, steps = plan_steps(n_train=data.n_train, batch_size=64, epochs=5, steps=None)
    sigma = calibrate_noise_multiplier(
        target_epsilon=8, target_delta=1e-5, sample_rate=q, steps=steps
    )
    r = train_trial(
        PackSpec(
            dataset=DatasetSpec("digits"),
            model=ModelSpec("mlp"),
            strategy=name,
            trials=[TrialSpec(lr=lr, noise_multiplier=sigma, params=params)],
            batch_size=64,
            epochs=5,
            eval_every=20,
        )
    )
    assert r.epsilon is not None and r.epsilon <= 8
    assert r.metrics["accuracy"] > 0.5, r.metrics["accuracy"]  # chance is 0.1
    t = r.trajectories
    assert len(t["clip"]) == len(t["lr"]) == len(t["frac_clipped"]) == len(t["step"])
    assert all(0.0 <= f <= 1.0 for f in t["frac_clipped"])
    assert all(b >= 0 for b in t["clip_bias"]) and all(-1 <= c <= 1 for c in t["grad_cos"])


@pytest.mark.parametrize("clip", [1e-6, 0.05, 1e6])  # all clipped, mixed, none clipped
def test_split_sums_equal_the_two_weighted_sums(clip: float) -> None:
    torch.manual_seed(0)
    module = build_model(ModelSpec("cnn"), input_shape=(1, 8, 8), num_classes=4, seed=0)
    model = PackedModel([module])
    x, y = torch.rand(9, 1, 8, 8), torch.randint(4, (9,))
    infos = packed_infos(model, x, y, "classification")
    sq = model.sq_norms(infos)
    s = make("online", [{"clip_init": clip}])
    s.gradient_noise_multiplier(torch.tensor([1.0]))
    res = s.clip(ctx_for(sq, torch.ones(1, 9)))
    extra = res.extra[0]
    assert extra.grad_coef is not None
    split_main, split_extra = torch.empty(1, model.numel), torch.empty(1, model.numel)
    model.split_sums_into(
        split_main, split_extra, infos, res.weights, extra.weights, extra.grad_coef
    )
    ref_main, ref_extra = torch.empty(1, model.numel), torch.empty(1, model.numel)
    model.weighted_sum_into(ref_main, infos, res.weights)
    model.weighted_sum_into(ref_extra, infos, extra.weights)
    torch.testing.assert_close(split_main, ref_main, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(split_extra, ref_extra, rtol=1e-5, atol=1e-6)
