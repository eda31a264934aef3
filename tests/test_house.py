"""The house keeps what the repository says of itself true: the README's layout table names
only what exists and every package there is; no module of `app/` outgrows 400 lines; code and
docs cite the repository's own contract (docs/contract.md, docs/design.md), never a document
outside it; and every file docs/flow.md walks through exists, with the function it names."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 400
TICKED = re.compile(r"`([^`\s]+)`")


def layout_rows() -> list[list[str]]:
    """The backticked names of each row of the README's layout table."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    assert len(rows) >= 10, "the layout table is missing or unreadable: the check is blind"
    return [TICKED.findall(row.split(" | ")[0]) for row in rows]


def named_paths() -> set[Path]:
    """Each path the layout table names: a name with a slash is from the root; a bare file
    name is inside the row's first folder."""
    paths: set[Path] = set()
    for names in layout_rows():
        folder: Path | None = None
        for name in names:
            if "/" in name or "." in name:
                path = ROOT / name.rstrip("/")
                if "/" not in name and folder is not None:
                    path = folder / name
                if name.endswith("/"):
                    folder = path
                paths.add(path)
    return paths


def test_every_path_the_layout_table_names_exists() -> None:
    missing = sorted(str(p.relative_to(ROOT)) for p in named_paths() if not p.exists())
    assert missing == [], f"README's layout table names what is not there: {missing}"


def test_the_layout_table_names_every_package() -> None:
    named = named_paths()
    packages = sorted(
        init.parent
        for root in (ROOT / "app", ROOT / "kit/python/telegram_intake_kit")
        for init in root.rglob("__init__.py")
        if "__pycache__" not in init.parts
    )
    assert packages, "no package found: the check is blind"
    unnamed = [
        str(package.relative_to(ROOT))
        for package in packages
        if not any(path == package or package in path.parents for path in named)
    ]
    assert unnamed == [], f"README's layout table does not name these packages: {unnamed}"


def test_no_module_of_app_is_over_400_lines() -> None:
    sizes = {
        str(path.relative_to(ROOT)): len(path.read_text().splitlines())
        for path in (ROOT / "app").rglob("*.py")
    }
    assert len(sizes) > 50, "too few modules found: the check is blind"
    over = {path: lines for path, lines in sorted(sizes.items()) if lines > MAX_LINES}
    assert over == {}, f"split by concern: {over}"


OUTSIDE = re.compile(r"\bSPEC\b|ADR 0256")


def test_code_and_docs_cite_only_what_the_repository_holds() -> None:
    """The contract and the design record are docs/contract.md and docs/design.md; a citation
    of a document outside the repository (SPEC, the ported toolkit's ADR) cannot be followed.
    docs/design.md may name where the decision came from."""
    files = [
        path
        for folder in ("app", "alembic", "bench", "kit/python", "kit/typescript/src", "tests")
        for path in (ROOT / folder).rglob("*")
        if path.suffix in {".py", ".ts", ".md", ".html", ".lua"} and "__pycache__" not in path.parts
    ]
    files += [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]
    files = [f for f in files if f not in {ROOT / "docs/design.md", Path(__file__)}]
    assert len(files) > 100, "too few files found: the check is blind"
    cited = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in files
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert cited == [], "\n".join(cited)


def test_every_file_and_name_the_flow_gives_exists() -> None:
    """docs/flow.md walks one update through files and the code in them: each path it gives
    exists, and each code name (a `Class.method`, a `snake_case` or `CamelCase` name; an
    `ALL_CAPS` one is a setting's variable) is still in the code, so a rename shows here."""
    flow = (ROOT / "docs/flow.md").read_text()
    names = set(TICKED.findall(flow))
    paths = {n for n in names if "/" in n and n.endswith((".py", ".ts", ".md"))}
    assert len(paths) >= 15, "too few files named: the check is blind"
    missing = sorted(n for n in paths if not (ROOT / n).is_file())
    corpus = "\n".join(
        path.read_text()
        for folder in ("app", "kit/python/telegram_intake_kit", "alembic")
        for path in (ROOT / folder).rglob("*.py")
    )
    words = set(re.findall(r"\w+", corpus))
    code = [
        n.removesuffix("()")
        for n in names - paths
        if re.fullmatch(r"[A-Za-z_][\w.]*(\(\))?", n)
        and not n.isupper()
        and ("_" in n or "." in n or re.search(r"[a-z][A-Z]", n))
    ]
    assert len(code) >= 30, "too few code names found: the check is blind"
    missing += sorted(n for n in code if not set(n.split(".")) <= words)
    assert missing == [], f"docs/flow.md gives what is not there: {missing}"
