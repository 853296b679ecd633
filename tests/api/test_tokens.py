"""API tokens: created once, stored as a hash, verified, revoked; and their CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sqlalchemy as sa

from api.cli import main
from dpsweep.errors import ConfigError
from sweeper.store.engine import make_engine
from sweeper.store.schema import upgrade
from sweeper.store.tokens import create_token, list_tokens, revoke_token, verify_token


@pytest.fixture
def url(tmp_path: Path) -> str:
    u = f"sqlite:///{tmp_path / 'tokens.db'}"
    upgrade(u)
    return u


def test_tokens_verify_until_revoked_and_only_a_hash_is_stored(url: str) -> None:
    engine = make_engine(url)
    secret, info = create_token(engine, name="ada")
    _, admin = create_token(engine, name="root", admin=True)
    p = verify_token(engine, secret)
    assert p is not None and (p.name, p.admin, p.token_id) == ("ada", False, info.id)
    assert verify_token(engine, secret + "x") is None
    assert verify_token(engine, "not-a-token") is None
    with engine.connect() as conn:
        dump = repr(conn.execute(sa.text("SELECT * FROM api_tokens")).all())
    assert (
        secret not in dump and secret.split("_", 2)[2] not in dump
    )  # the part after the id may hold "_"
    assert [t.name for t in list_tokens(engine)] == ["ada", "root"] and admin.admin
    revoke_token(engine, info.id)
    assert verify_token(engine, secret) is None
    assert [t.name for t in list_tokens(engine, include_revoked=False)] == ["root"]
    with pytest.raises(ConfigError, match="not allowed"):
        create_token(engine, name="bad name!")
    engine.dispose()


def test_token_cli_create_list_revoke(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["token", "create", "--name", "ada", "--db", url, "--json"]) == 0
    created = json.loads(capsys.readouterr().out)
    assert created["token"].startswith("dps_") and created["name"] == "ada"
    assert main(["token", "list", "--db", url, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [t["id"] for t in listed] == [created["id"]]
    assert created["token"] not in json.dumps(listed)
    assert main(["token", "revoke", created["id"], "--db", url]) == 0
    engine = make_engine(url)
    assert verify_token(engine, created["token"]) is None
    engine.dispose()
    assert main(["token", "revoke", "nope", "--db", url]) == 1
    assert "no token" in capsys.readouterr().err


def test_serve_refuses_no_auth_off_loopback(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--no-auth", "--host", "0.0.0.0", "--db", url])
    assert exc.value.code == 2
    assert "loopback" in capsys.readouterr().err


def test_token_create_then_list_on_a_fresh_database(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The README's order (a token, then serve) on a new --db: the file is migrated on first
    use, by `token create` as by every command."""
    fresh = f"sqlite:///{tmp_path / 'fresh.db'}"
    assert not (tmp_path / "fresh.db").exists()
    assert main(["token", "create", "--name", "x", "--db", fresh, "--json"]) == 0
    created = json.loads(capsys.readouterr().out)
    assert main(["token", "list", "--db", fresh, "--json"]) == 0
    assert [t["id"] for t in json.loads(capsys.readouterr().out)] == [created["id"]]


@pytest.mark.parametrize(
    "argv",
    [
        ["sweeps"],
        ["datasets", "list"],
        ["token", "list"],
        ["show", "sw_nope"],
    ],
)
def test_every_command_migrates_a_fresh_sqlite_file(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fresh = f"sqlite:///{tmp_path / 'fresh.db'}"
    code = main([*argv, "--db", fresh])
    err = capsys.readouterr().err
    assert "db upgrade" not in err and "schema revision" not in err, err
    assert code == (1 if argv[0] == "show" else 0), err


def test_a_refusal_is_one_line_and_usage_comes_with_h(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["token", "create", "--db", url])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1 and "usage:" not in err
    assert err.startswith("dpsweep token create: error: the following arguments are required")
    assert "`dpsweep token create -h` lists the options" in err
    with pytest.raises(SystemExit) as exc:
        main(["token", "create", "-h"])
    assert exc.value.code == 0 and capsys.readouterr().out.startswith("usage: dpsweep token")
