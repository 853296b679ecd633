"""A ``--db`` that is a path, not a URL: one line that says how to write it, no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from api.cli import main


@pytest.mark.parametrize(
    "command",
    [
        ["audit", "--dataset", "digits", "--model", "mlp", "--strategy", "fixed", "--epsilon", "8"],
        ["datasets", "list"],
        ["sweeps"],
    ],
    ids=["audit", "datasets-list", "sweeps"],
)
def test_a_path_for_db_is_refused_with_the_url_to_write(
    command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "dpsweep.db"
    assert main([*command, "--db", str(path)]) in (1, 2)  # usage, or the command's failure
    err = capsys.readouterr().err
    assert "--db takes a database URL" in err and "sqlite:////abs/path/dpsweep.db" in err
    assert "Traceback" not in err
    assert not path.exists()  # nothing was created or stored
