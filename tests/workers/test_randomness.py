"""Secret per-trial randomness, the floating-point-safe Gaussian, and the reproducible mode.

The attacks these tests try (issue: privacy against a real adversary): two trials of a grid
with equal public seeds sharing batches and noise; regenerating the noise from a stored seed;
reading a trial's secret from the database, the logs or any output; floating-point artefacts
of the noise revealing the private value's low bits.
"""

from __future__ import annotations

import base64
import json
import math
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import cloudpickle
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from workers.datasets.records import DatasetSpec
from workers.models import ModelSpec
from workers.randomness import (
    GRID_BITS,
    RandomStream,
    TrialRandomness,
    add_snapped_noise,
    snap_grid,
)
from workers.training.loop import train_pack, train_trial
from workers.training.specs import PackSpec, TrialSpec

DPSWEEP = shutil.which("dpsweep", path=str(Path(sys.executable).parent)) or "dpsweep"
REPO = Path(__file__).resolve().parents[2]


def _spec(trials: list[TrialSpec], randomness: str = "secret") -> PackSpec:
    return PackSpec(
        dataset=DatasetSpec("digits"),
        model=ModelSpec("logreg"),
        strategy="quantile",  # releases C_t, the trajectory the attack reads
        trials=trials,
        batch_size=64,
        steps=12,
        eval_every=4,
        randomness=randomness,  # type: ignore[arg-type]
    )


def _trial(seed: int = 0) -> TrialSpec:
    return TrialSpec(lr=0.5, seed=seed, noise_multiplier=1.0, params={})


# ---------------------------------------------------------------------------------------------
# Secret mode


def test_two_trials_with_equal_public_seeds_draw_different_batches_and_noise() -> None:
    """The attack of the issue: equal seed indices meant identical masks and noise, so the
    difference of two released C_t curves was the difference of private counts."""
    a, b = TrialRandomness.secret(), TrialRandomness.secret()
    assert not np.array_equal(a.noise.standard_normal(64), b.noise.standard_normal(64))
    assert not np.array_equal(a.sample.geometric(64, 0.05), b.sample.geometric(64, 0.05))
    # In a real pack: same seed, same hyperparameters, different released trajectories.
    r0, r1 = train_pack(_spec([_trial(0), _trial(0)]))
    assert r0.trajectories["clip"] != r1.trajectories["clip"]
    assert not torch.equal(r0.checkpoint, r1.checkpoint)
    assert r0.randomness == r1.randomness == "secret"


def test_the_same_spec_run_twice_gives_different_noise() -> None:
    first = train_trial(_spec([_trial(3)]))
    second = train_trial(_spec([_trial(3)]))
    assert first.trajectories["clip"] != second.trajectories["clip"]


def test_secrets_are_fresh_per_trial_and_never_pickled(monkeypatch: pytest.MonkeyPatch) -> None:
    drawn: list[bytes] = []
    real = __import__("secrets").token_bytes

    def spy(n: int) -> bytes:
        drawn.append(real(n))
        return drawn[-1]

    monkeypatch.setattr("workers.randomness.secrets.token_bytes", spy)
    results = train_pack(_spec([_trial(0), _trial(0), _trial(1)]))
    assert len(drawn) == 3 and len(set(drawn)) == 3 and all(len(s) == 32 for s in drawn)
    # Nothing a trial returns holds its secret, in any encoding.
    blob = pickle.dumps([r.to_dict() for r in results]) + repr(results).encode()
    for secret in drawn:
        for form in _encodings(secret):
            assert form not in blob
    # The objects that hold a secret refuse to be serialised (so they cannot end up in a Ray
    # object, a log record or a result by accident).
    rand = TrialRandomness.secret()
    for dump in (pickle.dumps, cloudpickle.dumps):
        for obj in (rand, rand.noise):
            with pytest.raises(TypeError, match="never leaves"):
                dump(obj)
    assert "secret" in repr(rand) and "secret" in repr(rand.noise)


def _encodings(secret: bytes) -> list[bytes]:
    """Forms in which a 32-byte secret could be written down."""
    forms = [
        secret,
        secret.hex().encode(),
        secret.hex().upper().encode(),
        base64.b64encode(secret),
        base64.urlsafe_b64encode(secret).rstrip(b"="),
        str(int.from_bytes(secret, "big")).encode(),
        str(int.from_bytes(secret, "little")).encode(),
    ]
    # A seed derived from part of it (e.g. a 64-bit torch seed), in decimal.
    for i in range(0, 32, 8):
        for order in ("big", "little"):
            forms.append(str(int.from_bytes(secret[i : i + 8], order)).encode())  # type: ignore[arg-type]
    return forms


@pytest.mark.slow
def test_a_real_sweeps_secrets_appear_nowhere(tmp_path: Path) -> None:
    """Run `dpsweep run` for real (local Ray, SQLite) with a hook that records every secret the
    Ray workers draw, then search the database file, the CLI's output, the export and every Ray
    log for each secret in every encoding."""
    hook = tmp_path / "hook"
    hook.mkdir()
    log = tmp_path / "secrets.log"
    # Loaded by every Python process of the run (driver and Ray workers) through PYTHONPATH.
    (hook / "sitecustomize.py").write_text(
        textwrap.dedent(
            f"""
            import secrets, sys
            _real = secrets.token_bytes
            def token_bytes(n=None):
                value = _real(n)
                caller = sys._getframe(1).f_code.co_filename
                if caller.endswith("workers/randomness.py"):
                    with open({str(log)!r}, "a") as f:
                        f.write(value.hex() + "\\n")
                return value
            secrets.token_bytes = token_bytes
            """
        )
    )
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        textwrap.dedent(
            """
            name: secret-search
            dataset: {name: digits}
            model: {name: logreg}
            training: {steps: 8, batch_size: 64, eval_every: 4}
            privacy: {budgets: [8], delta: 1.0e-5}
            arms:
              - strategy: quantile
                grid: {lr: [0.3, 1.0]}
            seeds: 2
            """
        )
    )
    db = tmp_path / "sweeps.db"
    ray_tmp = Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))  # short: Ray's socket paths
    env = {
        **os.environ,
        "PYTHONPATH": f"{hook}{os.pathsep}{REPO}",
        "RAY_TMPDIR": str(ray_tmp),
        "DPSWEEP_WORKERS": "2",
        "COLUMNS": "120",
    }
    try:
        run = subprocess.run(
            [DPSWEEP, "run", str(spec), "--db", f"sqlite:///{db}", "--plots", str(tmp_path / "p")],
            capture_output=True,
            env=env,
            timeout=600,
            stdin=subprocess.DEVNULL,
        )
        assert run.returncode == 0, run.stderr.decode()[-3000:]
        sweep_id = _only_sweep_id(db)
        exports = [
            subprocess.run(
                [DPSWEEP, "export", sweep_id, "--format", fmt, "--db", f"sqlite:///{db}"],
                capture_output=True,
                env=env,
                timeout=120,
                check=True,
            ).stdout
            for fmt in ("json", "csv")
        ]
        secrets_drawn = [bytes.fromhex(line) for line in log.read_text().split()]
        assert len(secrets_drawn) == 4  # 2 learning rates x 2 seeds, one secret each
        haystacks = [run.stdout, run.stderr, db.read_bytes(), *exports]
        haystacks += [p.read_bytes() for p in ray_tmp.rglob("*") if p.is_file() and _small(p)]
        for secret in secrets_drawn:
            for form in _encodings(secret):
                assert not any(form in h for h in haystacks), "a trial's secret leaked"
        assert b'"randomness": "secret"' in exports[0]  # the export says how noise was drawn
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)


def _small(p: Path) -> bool:
    try:
        return p.stat().st_size < 50 * 2**20 and not p.is_socket()
    except OSError:
        return False


def _only_sweep_id(db: Path) -> str:
    import sqlite3

    with sqlite3.connect(db) as con:
        (row,) = con.execute("select id from sweeps").fetchall()
    return str(row[0])


# ---------------------------------------------------------------------------------------------
# Reproducible mode


def test_reproducible_mode_same_seed_same_result() -> None:
    first = train_trial(_spec([_trial(5)], "reproducible"))
    second = train_trial(_spec([_trial(5)], "reproducible"))
    assert first.trajectories == second.trajectories
    assert torch.equal(first.checkpoint, second.checkpoint)
    summary = first.summary()
    assert summary["randomness"] == "reproducible"
    assert "not private against anyone who knows the seed" in summary["warning"]
    other = train_trial(_spec([_trial(6)], "reproducible"))
    assert other.trajectories["clip"] != first.trajectories["clip"]


# ---------------------------------------------------------------------------------------------
# The sampler and the snapped release


def test_the_sampler_is_gaussian() -> None:
    z = TrialRandomness.secret().noise.standard_normal(400_001)
    assert len(z) == 400_001 and np.isfinite(z).all()
    assert stats.kstest(z, "norm").pvalue > 1e-4
    assert abs(z.mean()) < 0.01 and abs(z.std() - 1.0) < 0.01
    assert abs(stats.kurtosis(z)) < 0.05 and abs(stats.skew(z)) < 0.03


class _Fixed(RandomStream):
    """A stream whose words are given (to reach the sampler's extreme inputs)."""

    def __init__(self, words: list[int]) -> None:
        super().__init__(bytes(32), 0)
        self._given = np.array(words, dtype=np.uint64).view(np.int64)

    def words_into(self, out: np.ndarray, n: int) -> None:
        out.view(np.int64)[:n] = np.resize(self._given, n)


def test_the_sampler_tail_is_not_truncated_near_six_sigma() -> None:
    """torch's float32 randn on CPU never exceeds ~5.8 standard deviations: a truncated Gaussian
    has unbounded privacy loss in its tails. Ours reaches ~11.4 from the smallest uniforms."""
    # u = -7 * 2**-51 and v = -2**-51 (u = m 2**-51 - 1 for the odd mantissa m).
    words = [(2**51 - 7) << 12, (2**51 - 1) << 12]
    z = _Fixed(words).standard_normal(1)
    u, s = -7 * 2.0**-51, 50 * 2.0**-102
    assert z[0] == pytest.approx(u * math.sqrt(-2 * math.log(s) / s), rel=1e-12)
    assert abs(z[0]) > 11.4


def test_uniform_and_geometric_are_exact_at_the_extremes() -> None:
    for w in (0, 2**64 - 1, 2**63, 2**63 - 1):
        u = _Fixed([w]).uniform(1)
        assert 0.0 < u[0] < 1.0
    g = TrialRandomness.secret().sample.geometric(200_000, 0.02)
    assert g.min() >= 1 and abs(g.mean() - 50.0) < 1.0


@settings(max_examples=200, deadline=None)
@given(
    x=st.lists(
        st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False, width=32),
        min_size=1,
        max_size=20,
    ),
    log_std=st.floats(-20, 10),
)
def test_a_release_lies_on_the_public_grid_within_half_a_cell(
    x: list[float], log_std: float
) -> None:
    """Mironov's attack reads the private value from which floats the noised output can be.
    Snapped outputs are integer multiples of a grid that depends only on the public noise
    scale, so the set of reachable outputs is the same for every private value."""
    std = torch.tensor([math.exp(log_std)])
    buf = torch.tensor([x], dtype=torch.float32)
    z = torch.randn(1, len(x), dtype=torch.float64)
    exact = buf.double() + std.double() * z
    add_snapped_noise(buf, z.clone(), std)
    grid = float(snap_grid(std.double())[0])
    assert grid <= float(std) * 2.0**-GRID_BITS and grid > float(std) * 2.0 ** -(GRID_BITS + 1)
    cells = buf.double() / grid
    small = exact.abs() < grid * 2**23  # where float32 holds the snapped value exactly
    assert torch.equal(cells[small], cells[small].round())
    err = (buf.double() - exact).abs()
    assert (err <= grid / 2 + exact.abs() * 2.0**-23).all()


def test_an_attacker_cannot_read_low_bits_of_the_private_value() -> None:
    """Two private sums that differ below the grid give the same output distribution: with the
    same draws, the outputs are equal or one cell apart, never a function of the low bits."""
    std = torch.tensor([0.37])
    x = torch.tensor([[0.1234567]], dtype=torch.float32)
    x2 = x + 1e-7  # differs in the low bits only
    for _ in range(200):
        z = torch.randn(1, 1, dtype=torch.float64)
        a = add_snapped_noise(x.clone(), z.clone(), std)
        b = add_snapped_noise(x2.clone(), z.clone(), std)
        grid = float(snap_grid(std.double())[0])
        assert abs(float(a - b)) in (0.0, pytest.approx(grid, rel=1e-6))


# ---------------------------------------------------------------------------------------------
# Sweeps: the label travels with every result


@pytest.fixture(scope="module")
def local_ray():  # type: ignore[no-untyped-def]
    from sweeper.driver.ray_backend import ray_session
    from sweeper.settings import SweeperSettings

    with ray_session(SweeperSettings(), workers=2):
        yield


def _run_sweep(tmp_path: Path, name: str, *, reproducible: bool | None) -> tuple[object, str]:
    from sweeper.driver.loop import run_sweep
    from sweeper.store.engine import make_engine
    from sweeper.store.schema import upgrade
    from sweeper.sweeps.create import create_sweep
    from tests.sweeper.sweeps.test_sweep import tiny_spec

    url = f"sqlite:///{tmp_path / (name + '.db')}"
    upgrade(url)
    engine = make_engine(url)
    spec = tiny_spec(
        arms=[{"strategy": "quantile", "grid": {"lr": [0.3, 1.0]}}],
        privacy={"budgets": [6], "delta": 1e-5}
        | ({} if reproducible is None else {"reproducible": reproducible}),
        seeds=2,
    )
    sweep_id = create_sweep(engine, spec)
    assert run_sweep(engine, sweep_id).state == "done"
    return engine, sweep_id


def test_reproducible_sweeps_repeat_and_are_labelled_everywhere(
    tmp_path: Path, local_ray: None
) -> None:
    import json as _json

    from sweeper.datasets.access import Viewer
    from sweeper.sweeps.export import export_sweep
    from sweeper.sweeps.stored import load_sweep
    from sweeper.sweeps.summary import summarize
    from sweeper.sweeps.sweep_pages import page_sweeps
    from sweeper.sweeps.trial_detail import trial_detail
    from sweeper.sweeps.trial_pages import page_trials

    def clip_curves(engine: object, sweep_id: str) -> list[list[float | None]]:
        viewer = Viewer(None)
        items = page_trials(engine, sweep_id, viewer, limit=50).items  # type: ignore[arg-type]
        return [trial_detail(engine, i["id"], viewer)["trajectories"]["clip"] for i in items]  # type: ignore[arg-type]

    outputs = {}
    for name, reproducible in (("r1", True), ("r2", True), ("s1", False), ("s2", None)):
        engine, sweep_id = _run_sweep(tmp_path, name, reproducible=reproducible)
        viewer = Viewer(None)
        summary = summarize(engine, sweep_id)  # type: ignore[arg-type]
        label = "reproducible" if reproducible else "secret"
        assert summary["randomness"] == label
        assert (summary["warning"] is not None) == bool(reproducible)
        items = page_trials(engine, sweep_id, viewer, limit=50).items  # type: ignore[arg-type]
        assert {i["randomness"] for i in items} == {label}
        assert trial_detail(engine, items[0]["id"], viewer)["randomness"] == label  # type: ignore[arg-type]
        assert page_sweeps(engine, viewer).items[0]["randomness"] == label  # type: ignore[arg-type]
        exported = _json.loads(export_sweep(engine, sweep_id, fmt="json"))  # type: ignore[arg-type]
        assert exported["sweep"]["randomness"] == label
        assert {t["randomness"] for t in exported["trials"]} == {label}
        csv_text = export_sweep(engine, sweep_id, fmt="csv")  # type: ignore[arg-type]
        assert csv_text.splitlines()[0].split(",").count("randomness") == 1
        assert all(line.endswith(label) or label in line for line in csv_text.splitlines()[1:])
        assert len(load_sweep(engine, sweep_id).trials) == 4  # type: ignore[arg-type]
        outputs[name] = clip_curves(engine, sweep_id)
    # Same spec and seeds: reproducible sweeps repeat exactly, secret ones never.
    assert outputs["r1"] == outputs["r2"]
    assert outputs["s1"] != outputs["s2"]
    # Within a secret sweep the two seeds' trials of one grid point differ as well.
    assert len({_json.dumps(c) for c in outputs["s1"]}) == 4


def test_stored_sweeps_without_the_field_are_labelled_reproducible() -> None:
    """Sweeps stored before secret randomness existed drew noise from public seeds."""
    from dpsweep.spec import randomness_label

    assert randomness_label({"privacy": {"budgets": [1], "delta": 1e-5}}) == "reproducible"
    assert randomness_label({"privacy": {"reproducible": False}}) == "secret"
    assert randomness_label({"privacy": {"reproducible": True}}) == "reproducible"


def test_cli_run_reproducible_flag_warns(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "name: flag\ndataset: {name: digits}\nmodel: {name: logreg}\n"
        "training: {steps: 4, batch_size: 64, eval_every: 2}\n"
        "privacy: {budgets: [8], delta: 1.0e-5}\narms: [{strategy: fixed, grid: {lr: [0.5]}}]\n"
    )
    db = f"sqlite:///{tmp_path / 'x.db'}"
    env = {**os.environ, "COLUMNS": "200", "DPSWEEP_WORKERS": "1"}
    p = subprocess.run(
        [DPSWEEP, "run", str(spec), "--reproducible", "--db", db, "--plots", str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    assert "not private against anyone who knows the seed" in p.stderr
    assert "not private against anyone who knows the seed" in p.stdout  # the results block
    show = subprocess.run(
        [DPSWEEP, "sweeps", "--json", "--db", db], capture_output=True, text=True, env=env
    )
    assert [r["randomness"] for r in json.loads(show.stdout)] == ["reproducible"]
