"""The deployment files and the secrets rules of ``dpsweep serve``.

``docker-compose.yml`` (with ``.env.example``, and with the GPU override) is validated by
docker-compose itself (v1 from PyPI, in ``.venv-compose``, built by ``make test``; no Docker
engine needed), and its service graph is checked on the *resolved* configuration.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from sqlalchemy import delete
from sqlalchemy.orm import Session

from api.testing.postgres import free_port
from api.testing.server import DPSWEEP, start_server
from sweeper.store.engine import display_url, make_engine
from sweeper.store.rows import ApiToken
from sweeper.store.schema import upgrade
from sweeper.store.tokens import (
    EXAMPLE_ADMIN_TOKEN,
    EXAMPLE_DB_PASSWORD,
    EXAMPLE_RAY_TOKEN,
    ensure_token,
    list_tokens,
    revoke_token,
    verify_token,
)
from tests.conftest import sqlite_or_postgres_url

ROOT = Path(__file__).resolve().parents[2]
STRONG = "dps_" + "k3Yq" * 10


def _compose() -> str:
    for c in (
        os.environ.get("DPSWEEP_DOCKER_COMPOSE"),
        str(ROOT / ".venv-compose" / "bin" / "docker-compose"),
        shutil.which("docker-compose"),
    ):
        if c and Path(c).exists():
            return c
    pytest.fail("docker-compose v1 is missing: `make .venv-compose/.installed-stamp` builds it")


def _config(*files: str) -> dict[str, Any]:
    args = [_compose(), "--env-file", ".env.example"]
    for f in files:
        args += ["-f", f]
    out = subprocess.run([*args, "config"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return dict(yaml.safe_load(out.stdout))


def test_compose_file_is_valid_and_its_service_graph_is_complete() -> None:
    cfg = _config("docker-compose.yml")
    svc = cfg["services"]
    assert set(svc) == {"postgres", "migrate", "api", "ray-head", "ray-worker"}

    # Start order: postgres healthy -> migrate done -> api; the head healthy before workers.
    assert svc["migrate"]["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    assert svc["api"]["depends_on"] == {
        "migrate": {"condition": "service_completed_successfully"},
        "ray-head": {"condition": "service_healthy"},
    }
    assert svc["ray-worker"]["depends_on"] == {"ray-head": {"condition": "service_healthy"}}
    assert "pg_isready" in " ".join(svc["postgres"]["healthcheck"]["test"])
    assert svc["api"]["healthcheck"]["test"][-1].endswith("/ready")
    assert "healthcheck" in svc["ray-head"]
    assert svc["migrate"]["command"] == ["dpsweep", "db", "upgrade"]
    assert svc["migrate"]["restart"] == "no"

    # Each service has the environment it needs, from .env, and nothing it should not.
    url = svc["api"]["environment"]["DPSWEEP_DATABASE_URL"]
    assert url.startswith("postgresql+psycopg://") and "@postgres:5432/" in url
    assert svc["migrate"]["environment"]["DPSWEEP_DATABASE_URL"] == url
    assert svc["api"]["environment"]["DPSWEEP_RAY_ADDRESS"] == "ray-head:6379"
    assert svc["api"]["environment"]["DPSWEEP_ADMIN_TOKEN"] == EXAMPLE_ADMIN_TOKEN
    for name in ("api", "ray-head", "ray-worker"):
        env = svc[name]["environment"]
        assert env["RAY_AUTH_MODE"] == "token" and env["RAY_AUTH_TOKEN"] == EXAMPLE_RAY_TOKEN
    assert "DPSWEEP_ADMIN_TOKEN" not in svc["ray-worker"]["environment"]
    assert svc["postgres"]["environment"]["POSTGRES_PASSWORD"] == EXAMPLE_DB_PASSWORD

    # The API's command serves on all interfaces without migrating (migrate did), the port
    # is published; uploads are shared with the workers; the database persists.
    api_cmd = svc["api"]["command"]
    assert api_cmd[:2] == ["dpsweep", "serve"] and "--no-migrate" in api_cmd
    port = svc["api"]["ports"][0]
    assert (port["target"] if isinstance(port, dict) else port.split(":")[-1]) in (8000, "8000")
    mounts = {n: dict(_mount(v) for v in svc[n].get("volumes", [])) for n in svc}
    assert mounts["api"]["dpsweep-data"] == mounts["ray-worker"]["dpsweep-data"] == "/data"
    assert mounts["postgres"]["pgdata"] == "/var/lib/postgresql/data"
    # Trained models: the API (and its scheduler, the driver that writes them) keep them in
    # their own volume, which the workers do not mount.
    assert mounts["api"]["dpsweep-artifacts"] == "/artifacts"
    assert svc["api"]["environment"]["DPSWEEP_ARTIFACT_URL"] == "/artifacts"
    assert "dpsweep-artifacts" not in mounts["ray-worker"]
    assert set(cfg["volumes"]) == {"pgdata", "dpsweep-data", "dpsweep-artifacts"}

    # Scalable workers: no fixed container name, no host ports; they join the head.
    worker = svc["ray-worker"]
    assert "container_name" not in worker and "ports" not in worker
    assert "--address=ray-head:6379" in _words(worker["command"])
    # One image, built with the torch variant chosen in .env.
    assert {s["build"]["args"]["TORCH_VARIANT"] for s in svc.values() if "build" in s} == {"cpu"}


def _words(command: str | list[str]) -> list[str]:
    return command.split() if isinstance(command, str) else list(command)


def _mount(v: Any) -> tuple[str, str]:
    """(source, target) of a volume in either of compose's forms."""
    if isinstance(v, str):
        source, target = v.split(":")[:2]
        return source, target
    return v["source"], v["target"]


def test_gpu_override_reserves_a_gpu_per_worker_with_a_cuda_build() -> None:
    cfg = _config("docker-compose.yml", "docker-compose.gpu.yml")
    worker = cfg["services"]["ray-worker"]
    devices = worker["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}]
    assert "--num-gpus=1" in _words(worker["command"])
    assert worker["build"]["args"]["TORCH_VARIANT"].startswith("cu")
    assert cfg["services"]["api"]["environment"]["DPSWEEP_GPU_FRACTION"] == "1.0"
    # The base file is unchanged by the override elsewhere: postgres has no GPU.
    assert "deploy" not in cfg["services"]["postgres"]


def test_compose_refuses_to_run_without_the_secrets() -> None:
    """Without a .env, interpolation stops with a message that says what to set."""
    empty = ROOT / "tests" / "data-empty.env"
    empty.write_text("")
    try:
        out = subprocess.run(
            [_compose(), "--env-file", str(empty), "config"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            env={k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "POSTGRES_"))},
        )
    finally:
        empty.unlink()
    assert out.returncode != 0
    assert "in .env" in out.stderr


def test_dockerfile_picks_the_torch_build_and_bakes_no_secret() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^ARG TORCH_VARIANT=cpu$", text, flags=re.M)
    assert "download.pytorch.org/whl/${TORCH_VARIANT}" in text
    assert re.search(r"^USER dpsweep$", text, flags=re.M)
    for line in text.splitlines():
        if line.startswith(("ENV", "ARG")) or line.strip().startswith(("DPSWEEP_", "RAY_")):
            assert not re.search(r"TOKEN|PASSWORD|SECRET", line), line
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".env" in ignored and ".venv" in ignored and ".git" in ignored
    example = (ROOT / ".env.example").read_text()
    for secret in (EXAMPLE_ADMIN_TOKEN, EXAMPLE_DB_PASSWORD, EXAMPLE_RAY_TOKEN):
        assert secret in example  # the values serve refuses are exactly the example's


# ---------------------------------------------------------------------------------------------
# dpsweep serve and the example secrets


def _serve_once(tmp_path: Path, env: dict[str, str], db_url: str | None = None) -> Any:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("DPSWEEP_", "RAY_AUTH"))}
    url = db_url or f"sqlite:///{tmp_path / 'refuse.db'}"
    return subprocess.run(
        [DPSWEEP, "serve", "--port", str(free_port()), "--db", url, "--no-scheduler"],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.parametrize(
    ("env", "db_url", "says"),
    [
        ({"DPSWEEP_ADMIN_TOKEN": EXAMPLE_ADMIN_TOKEN}, None, "DPSWEEP_ADMIN_TOKEN is still"),
        ({"DPSWEEP_ADMIN_TOKEN": "short"}, None, "at least 32"),
        ({"RAY_AUTH_TOKEN": EXAMPLE_RAY_TOKEN}, None, "RAY_AUTH_TOKEN is still"),
        (
            {},
            f"postgresql+psycopg://u:{EXAMPLE_DB_PASSWORD}@127.0.0.1:1/x",
            "database password is still",
        ),
    ],
)
def test_serve_refuses_the_example_secrets_outside_dev_mode(
    tmp_path: Path, env: dict[str, str], db_url: str | None, says: str
) -> None:
    out = _serve_once(tmp_path, env, db_url)
    assert out.returncode == 1, out.stderr
    assert says in out.stderr
    assert "DPSWEEP_DEV" in out.stderr or "secrets" in out.stderr
    assert EXAMPLE_DB_PASSWORD not in out.stderr  # nor is a password ever printed
    assert not (tmp_path / "refuse.db").exists()  # refused before touching the database


@pytest.mark.slow
def test_dev_mode_allows_the_example_token_and_a_strong_one_works(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'dev.db'}"
    env = {"DPSWEEP_ADMIN_TOKEN": EXAMPLE_ADMIN_TOKEN, "DPSWEEP_DEV": "true"}
    server = start_server(url, tmp_path, scheduler=False, env=env)
    try:
        me = httpx.get(
            server.base + "/api/v1/me", headers={"Authorization": f"Bearer {EXAMPLE_ADMIN_TOKEN}"}
        )
        assert me.status_code == 200 and me.json() == {"name": "admin", "admin": True, "auth": True}
    finally:
        server.stop()
    # Production: a strong bootstrap token is made valid; restarting does not duplicate it.
    env = {"DPSWEEP_ADMIN_TOKEN": STRONG}
    for _ in range(2):
        server = start_server(url, tmp_path, scheduler=False, env=env)
        try:
            r = httpx.get(server.base + "/api/v1/me", headers={"Authorization": f"Bearer {STRONG}"})
            assert r.json()["admin"] is True
        finally:
            server.stop()
    engine = make_engine(url)
    try:
        assert len(list_tokens(engine)) == 2  # the example one (dev run) and the strong one
    finally:
        engine.dispose()


def test_ensure_token_is_idempotent_and_a_revoked_bootstrap_stays_revoked(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 't.db'}"
    upgrade(url)
    engine = make_engine(url)
    try:
        a = ensure_token(engine, name="admin", secret=STRONG, admin=True)
        b = ensure_token(engine, name="admin", secret=STRONG, admin=True)
        assert a.id == b.id and len(list_tokens(engine)) == 1
        assert verify_token(engine, STRONG) is not None
        revoke_token(engine, a.id)
        c = ensure_token(engine, name="admin", secret=STRONG, admin=True)
        assert c.revoked_at is not None and verify_token(engine, STRONG) is None
    finally:
        engine.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def fresh_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return sqlite_or_postgres_url(request, tmp_path)


def test_replicas_starting_at_once_all_get_the_one_bootstrap_token(fresh_url: str) -> None:
    """API replicas that start together race to insert the bootstrap token: none may fail."""
    engine = make_engine(fresh_url)
    barrier = threading.Barrier(6)
    got: list[str] = []
    errors: list[BaseException] = []

    def start() -> None:
        barrier.wait()
        try:
            got.append(ensure_token(engine, name="admin", secret=STRONG, admin=True).id)
        except BaseException as exc:
            errors.append(exc)

    try:
        for _ in range(5):
            threads = [threading.Thread(target=start) for _ in range(6)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
            assert not errors and len(set(got)) == 1 and len(list_tokens(engine)) == 1
            with Session(engine) as s, s.begin():  # the next round races a fresh insert
                s.execute(delete(ApiToken))
    finally:
        engine.dispose()


def test_the_database_password_is_masked_in_messages() -> None:
    shown = display_url("postgresql+psycopg://dpsweep:hunter2@db:5432/dpsweep")
    assert "hunter2" not in shown and shown.endswith("@db:5432/dpsweep")
    out = subprocess.run(
        [DPSWEEP, "db", "current", "--db", "postgresql+psycopg://u:hunter2@127.0.0.1:1/x"],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if not k.startswith("DPSWEEP_")},
    )
    assert out.returncode != 0 and "hunter2" not in out.stdout + out.stderr
    assert "u:***@127.0.0.1" in out.stderr


# ---------------------------------------------------------------------------------------------
# GPU shares (the CUDA path itself needs a GPU machine; these run everywhere)


def test_gpu_request_sums_trial_shares_up_to_one_gpu() -> None:
    from sweeper.driver.ray_backend import gpu_request

    assert gpu_request(3, gpus_per_trial=0.25, gpu_fraction=1.0) == 0.75
    assert gpu_request(8, gpus_per_trial=0.25, gpu_fraction=1.0) == 1.0
    assert gpu_request(1, gpus_per_trial=None, gpu_fraction=0.5) == 0.5
    assert gpu_request(3, gpus_per_trial=0.1, gpu_fraction=1.0) == 0.3


def test_resources_in_the_spec_are_validated_and_do_not_change_the_sweep_hash() -> None:
    from dpsweep.errors import ConfigError
    from dpsweep.spec import load_spec
    from sweeper.sweeps.create import spec_hash

    base = yaml.safe_load((ROOT / "examples" / "demo.yaml").read_text())
    plain = load_spec(base)
    gpu = load_spec({**base, "resources": {"gpus_per_trial": 0.25}})
    assert gpu.resources.gpus_per_trial == 0.25 and plain.resources.gpus_per_trial is None
    assert spec_hash(gpu) == spec_hash(plain)
    for bad in (0, 1.5, -1):
        with pytest.raises(ConfigError) as e:
            load_spec({**base, "resources": {"gpus_per_trial": bad}})
        assert e.value.field == "resources.gpus_per_trial"
