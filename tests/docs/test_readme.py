"""The repository's own documentation stands alone and tells the truth.

* Every relative link and image in README.md and docs/*.md resolves to a file in the repository,
  and every ``#anchor`` to a heading of the file it points into.
* No file in the repository refers to design notes or environment notes kept outside it.
* The README's quick start (the ``bash`` block after ``<!-- quickstart -->``) runs verbatim, one
  command at a time, in a fresh directory laid out like a clone after ``make install`` (the
  installed ``.venv`` and the ``examples/`` folder, nothing else): every command must exit 0, and
  the database it leaves holds what the commands say they did.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
# [text](target "title") and ![alt](target); the target may be wrapped in <...>.
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.M)
_HTML = re.compile(r"<(?:a|img)\b[^>]*?\b(?:href|src)=\"([^\"]+)\"", re.I)
_HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)


def _prose(text: str) -> str:
    """The text without fenced code blocks and code spans (their brackets are not links)."""
    return _CODE_SPAN.sub("", _FENCE.sub("", text))


def _targets(text: str) -> list[str]:
    prose = _prose(text)
    return [m.group(1) for pattern in (_LINK, _REFERENCE, _HTML) for m in pattern.finditer(prose)]


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: link syntax and punctuation dropped, lower case, spaces
    to hyphens (letters of any script, digits, ``_`` and ``-`` kept)."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"<[^>]+>", "", text).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out: set[str] = set()
    for m in _HEADING.finditer(_FENCE.sub("", path.read_text(encoding="utf-8"))):
        slug = _slug(m.group(1))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    # Explicit anchors: <a id="..."> / <a name="...">.
    text = path.read_text(encoding="utf-8")
    out.update(re.findall(r"<a\s+(?:id|name)=\"([^\"]+)\"", text))
    return out


def test_slugs_follow_github() -> None:
    assert _slug("What ε covers") == "what-ε-covers"
    assert _slug("3. Using an existing Ray cluster or PostgreSQL") == (
        "3-using-an-existing-ray-cluster-or-postgresql"
    )
    assert _slug("Set-up: two commands") == "set-up-two-commands"
    assert _slug("`dpsweep train` and [links](x.md)") == "dpsweep-train-and-links"


def test_the_link_checker_finds_links_and_skips_code() -> None:
    text = "a [x](docs/a.md#b) ![i](fig.png) `[no](code.md)`\n```\n[no](fence.md)\n```\n[r]: r.md\n"
    assert _targets(text) == ["docs/a.md#b", "fig.png", "r.md"]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_resolves_inside_the_repository(doc: Path) -> None:
    broken = []
    for target in _targets(doc.read_text(encoding="utf-8")):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
            continue
        path_part, _, anchor = target.partition("#")
        dest = (doc.parent / path_part).resolve() if path_part else doc
        if not dest.is_relative_to(ROOT) or not dest.exists():
            broken.append(f"{target}: no such file in the repository")
            continue
        if anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert not broken, f"{doc.relative_to(ROOT)}: " + "; ".join(broken)


# Built from parts, so that this file does not name what it looks for.
_OUTSIDE = re.compile(
    "|".join(
        (
            re.escape("DESIGN" + ".md"),
            re.escape("ENV" + ".md"),
            r"(?<![\w-])" + "shared" + "/",
        )
    ).encode()
)


def test_no_file_refers_to_notes_outside_the_repository() -> None:
    git = shutil.which("git")
    if git is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    listed = subprocess.run(
        [git, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    hits = []
    for name in filter(None, listed):
        path = ROOT / os.fsdecode(name)
        if not path.is_file():  # (a file deleted in the working tree)
            continue
        for lineno, line in enumerate(path.read_bytes().splitlines(), 1):
            if _OUTSIDE.search(line):
                hits.append(f"{os.fsdecode(name)}:{lineno}")
    assert not hits, "refer to the repository's own docs instead: " + ", ".join(hits)


def quickstart_commands() -> list[str]:
    """The README's quick-start commands, verbatim (continuation lines joined)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    m = re.search(r"<!-- quickstart -->\s*```(?:bash|sh)\n(.*?)^```", readme, re.S | re.M)
    assert m, "README.md has no ```bash block after <!-- quickstart -->"
    commands: list[str] = []
    pending = ""
    for line in m.group(1).splitlines():
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        command = (pending + line).strip()
        pending = ""
        if command and not command.startswith("#"):
            commands.append(command)
    assert not pending, "the quick start ends in a continuation line"
    return commands


@pytest.mark.slow
def test_the_readme_quick_start_runs_verbatim(tmp_path: Path) -> None:
    from sqlalchemy import func, select
    from sqlalchemy.orm import Session

    from sweeper.datasets.identity import ledger_key_of
    from sweeper.privacy.ledger.budget_ledger import BudgetLedger
    from sweeper.privacy.ledger.rows import EntryKind
    from sweeper.store import Sweep, SweepState, Trial, TrialState
    from sweeper.store.engine import make_engine

    commands = quickstart_commands()
    assert len(commands) >= 5 and all(c.startswith(".venv/bin/dpsweep ") for c in commands)
    # A fresh directory laid out like a clone after `make install`: the installed environment
    # and the examples, nothing else (no database, no results, no artifacts).
    fresh = tmp_path / "clone"
    fresh.mkdir()
    (fresh / ".venv").symlink_to(Path(sys.prefix), target_is_directory=True)
    shutil.copytree(ROOT / "examples", fresh / "examples")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DPSWEEP_", "RAY_"))}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["COLUMNS"] = "120"
    outputs = []
    for command in commands:
        p = subprocess.run(
            ["bash", "-e", "-o", "pipefail", "-c", command],
            cwd=fresh,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            stdin=subprocess.DEVNULL,
        )
        assert p.returncode == 0, f"{command!r} exited {p.returncode}:\n{p.stdout}\n{p.stderr}"
        outputs.append(p.stdout + p.stderr)

    # What the commands said they did, read back from the database they left behind.
    engine = make_engine(f"sqlite:///{fresh / 'dpsweep.db'}")
    try:
        with Session(engine) as session:
            sweeps = session.scalars(select(Sweep)).all()
            assert [(s.name, s.state) for s in sweeps] == [("quickstart", SweepState.done)]
            done = session.scalar(
                select(func.count()).select_from(Trial).where(Trial.state == TrialState.done)
            )
            assert done == 2
        ledger = BudgetLedger(engine)
        charges = [
            e for e in ledger.entries(ledger_key_of(engine, "digits")) if e.kind == EntryKind.CHARGE
        ]
        # Two trials of the sweep (run once: the second `run` spent nothing) and `train`'s run.
        assert len(charges) == 3
        assert sum(1 for e in charges if e.sweep_id.startswith("train_")) == 1
    finally:
        engine.dispose()
    assert any("dps_" in out for out in outputs)  # the token was printed
