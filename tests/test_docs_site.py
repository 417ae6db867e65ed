"""The documentation site builds strictly; its API reference shows links where the docstrings have roles."""

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ROLE = re.compile(r":(?:func|class|meth|attr|data|mod|exc|obj|const):")

DOCS_EXTRA = ("mkdocs", "mkdocstrings", "mkdocs_include_markdown_plugin")
needs_mkdocs = pytest.mark.skipif(
    any(importlib.util.find_spec(module) is None for module in DOCS_EXTRA),
    reason="the docs extra is not installed (pip install -e '.[docs]'); CI builds the site after the suite",
)


@needs_mkdocs
@pytest.mark.timeout(300)
def test_the_api_reference_shows_links_not_roles_and_the_collectives_first(tmp_path: Path) -> None:
    site = tmp_path / "site"
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)]
    environment = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=280)
    assert result.returncode == 0, result.stderr
    pages = sorted((site / "reference").glob("*/index.html"))
    assert len(pages) >= 7
    for page in pages:
        html = page.read_text()
        assert not ROLE.findall(html), f"{page.parent.name}: raw roles {ROLE.findall(html)[:5]}"
    api = (site / "reference" / "collectives" / "index.html").read_text()
    assert 'href="#collectives.allgather"' in api  # a role became a link to its entry
    anchors = re.findall(r'id="(collectives\.[A-Za-z_]+)"', api)
    assert anchors[:3] == ["collectives.allreduce", "collectives.reduce_scatter", "collectives.allgather"]
    guide = (site / "index.html").read_text()
    assert 'href="usage/"' in guide and "bench/compare-2ranks.json" in guide  # the README's links and table
