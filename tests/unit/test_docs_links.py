"""Every link in the README and docs/, and every repository path named in README, docs/ and examples/,
resolves to a file or folder of the repository (a renamed module must take its mentions with it)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOP = ("fleetllm", "benchmarks", "tests", "examples", "docs", ".ci")
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
EXAMPLES = sorted(p for p in (ROOT / "examples").rglob("*") if p.suffix in (".yaml", ".py"))
# A repository path as the text names it: a top-level folder, then path characters (no spaces, no globs).
PATH = re.compile(r"(?<![\w./-])((?:%s)/[\w./-]*[\w/])" % "|".join(re.escape(t) for t in TOP))
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")


def _missing_paths(text: str) -> list[str]:
    missing = []
    for match in PATH.finditer(text):
        name = match.group(1).rstrip(".")
        if any(ch in name for ch in "*{}<>") or "results/" in name and name.endswith("/"):
            continue
        if not (ROOT / name).exists():
            missing.append(name)
    return missing


def test_links_in_readme_and_docs_resolve():
    broken = []
    for doc in DOCS:
        for match in LINK.finditer(doc.read_text()):
            target = match.group(1)
            if re.match(r"[a-z]+://", target) or target.startswith("mailto:"):
                continue
            if not (doc.parent / target).exists():
                broken.append(f"{doc.relative_to(ROOT)}: {target}")
    assert not broken, "links to nothing:\n" + "\n".join(broken)


def test_repository_paths_named_in_docs_and_examples_exist():
    missing = []
    for path in [*DOCS, *EXAMPLES]:
        missing += [f"{path.relative_to(ROOT)}: {name}" for name in _missing_paths(path.read_text())]
    assert not missing, "paths named but not in the repository:\n" + "\n".join(sorted(set(missing)))


def test_readme_is_a_front_page():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines: move reference material into docs/"
    assert "make demo" in "\n".join(lines) and "make test" in "\n".join(lines)
