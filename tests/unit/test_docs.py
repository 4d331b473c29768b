"""The documentation lives in the repository and follows the code: every relative link in
README.md and docs/ resolves to a file of the repository (a heading, for an anchor), nothing
points outside it, the bookie.toml table is the generated one, and the Grafana dashboard names
real metrics."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from stream.autorecovery import metrics as autorecovery_metrics
from stream.autorecovery import phase_two
from stream.bookie import metrics as bookie_metrics
from stream.bookie.config_docs import committed_table, config_table

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```.*?^```", re.M | re.S)
# What pointed at the design notes of the people who wrote the code, not at this repository.
_OUTSIDE = re.compile(r"\.\./shared|shared/DESIGN|\bDESIGN §|\(DESIGN\b")


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = _FENCE.sub("", path.read_text())
    return {_slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", text, re.M)}


def _links(path: Path) -> list[str]:
    return _LINK.findall(_FENCE.sub("", path.read_text()))


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: p.name)
def test_every_relative_link_resolves_inside_the_repository(document: Path) -> None:
    links = _links(document)
    assert links or document.name == "benchmarks.md"
    for link in links:
        if re.match(r"^[a-z]+:", link):
            continue  # a web address
        target, _, anchor = link.partition("#")
        resolved = (document.parent / target).resolve() if target else document
        assert resolved.is_relative_to(ROOT), f"{document.name}: {link} leaves the repository"
        assert resolved.is_file(), f"{document.name}: {link} names no file"
        if anchor:
            assert anchor in _anchors(resolved), f"{document.name}: {link}: no such heading"


def test_nothing_the_repository_ships_points_outside_it() -> None:
    tracked = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    offenders = []
    for name in tracked:
        path = ROOT / name
        if path.suffix not in {".md", ".py", ".proto", ".sh", ".toml"} or not path.is_file():
            continue
        if path == Path(__file__).resolve():
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if _OUTSIDE.search(line):
                offenders.append(f"{name}:{number}: {line.strip()}")
    assert offenders == []


def test_the_bookie_config_table_is_the_generated_one() -> None:
    committed = committed_table((ROOT / "docs" / "operations.md").read_text())
    assert committed == config_table(), (
        "regenerate it: python -m stream.bookie.config_docs --write docs/operations.md"
    )


def _registered(module: object) -> set[str]:
    return {
        metric.describe()[0].name
        for metric in vars(module).values()
        if hasattr(metric, "describe") and hasattr(metric, "_name")
    }


def test_the_grafana_dashboard_charts_every_bookie_metric_and_no_other() -> None:
    dashboard = json.loads((ROOT / "docs" / "grafana" / "bookies.json").read_text())
    queried = {
        re.sub(r"_(total|bucket|sum|count)$", "", name)
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
        for name in re.findall(r"streamkeeper_\w+", target["expr"])
    }
    # Phase two runs in the bookie process; its metrics live with its code.
    bookie = _registered(bookie_metrics) | _registered(phase_two)
    known = bookie | _registered(autorecovery_metrics)
    assert queried - known == set()
    assert bookie - queried == set()
    assert {m.name for m in REGISTRY.collect()} >= known
