"""House rules of the library: no unused imports or undefined names, and no stage importing a later one."""
import ast, re
from pathlib import Path
import pytest

LIB = Path(__file__).resolve().parent.parent / "codellm_nb"
MODULES = sorted(p for p in LIB.glob("*.py") if p.name not in ("__init__.py", "_modidx.py"))

def notebook_of(path:Path) -> str:
    "The notebook a module is exported from (nbdev writes it in the module's first cell marker)."
    return re.search(r"# %% \.\./nbs/([\w.]+)\.ipynb", path.read_text())[1]

def project_imports(path:Path) -> set[str]:
    "The `codellm_nb` modules `path` imports anywhere (top level or inside functions)."
    out = set()
    for n in ast.walk(ast.parse(path.read_text())):
        if isinstance(n, ast.ImportFrom):
            mod = n.module or ""
            if n.level == 1: out.add(mod.split(".")[0])
            elif mod.startswith("codellm_nb."): out.add(mod.split(".")[1])
        elif isinstance(n, ast.Import):
            out |= {a.name.split(".")[1] for a in n.names if a.name.startswith("codellm_nb.")}
    return out

def test_no_unused_imports_or_undefined_names():
    from pyflakes.api import check
    from pyflakes.reporter import Reporter
    import io
    out = io.StringIO()
    problems = sum(check(p.read_text(), str(p.relative_to(LIB.parent)), Reporter(out, out)) for p in MODULES)
    assert problems == 0, out.getvalue()

def late_imports(modules:dict[str, str], imports:dict[str, set]) -> list[tuple[str, str]]:
    """`(importer, imported)` pairs where a module imports one whose notebook comes later — except that a notebook
    `NN_name` may tie together its own lettered steps `NNa_…`, `NNb_…` (which then must not import it back)."""
    num = lambda nb: re.match(r"\d+", nb)[0]
    parts = lambda nb: re.match(r"\d+[a-z]_", nb) is not None
    aggregators = {m for m, nb in modules.items() if not parts(nb)
                   and any(parts(modules[i]) and num(modules[i]) == num(nb) for i in imports[m] if i in modules)}
    bad = []
    for m, nb in modules.items():
        for i in sorted(imports[m] & set(modules)):
            own_step = m in aggregators and num(modules[i]) == num(nb)
            if (modules[i] > nb and not own_step) or (i in aggregators and parts(nb) and num(modules[i]) == num(nb)): bad.append((m, i))
    return bad

def test_no_stage_imports_a_later_one():
    late = late_imports({p.stem: notebook_of(p) for p in MODULES}, {p.stem: project_imports(p) for p in MODULES})
    assert late == [], f"modules importing from notebooks that come after their own: {late}"

def test_the_order_rule():
    nbs = {"core": "00_core", "data": "01_data", "sources": "01a_data.sources", "pretrain": "02_pretrain",
           "compression": "02a_pretrain.compression", "serve": "05_serve"}
    ok = {"core": set(), "data": {"sources", "core"}, "sources": {"core"}, "pretrain": {"data"}, "compression": {"pretrain"},
          "serve": {"core"}}
    assert late_imports(nbs, ok) == []
    assert late_imports(nbs, ok | {"core": {"serve"}}) == [("core", "serve")]
    assert late_imports(nbs, ok | {"sources": {"data"}}) == [("sources", "data")]  # a step importing its aggregator

@pytest.mark.parametrize("bad", ["from codellm_nb.serve import Engine", "from .serve import Engine"])
def test_the_order_check_sees_late_imports(tmp_path, bad):
    mod = tmp_path / "early.py"
    mod.write_text(f"# %% ../nbs/00_core.ipynb #x\ndef f():\n    {bad}\n")
    assert project_imports(mod) == {"serve"}

def test_every_requirement_runs_on_the_declared_python():
    "settings.ini's `min_python` is what the requirements allow: each installed requirement's Requires-Python admits it."
    import configparser, shlex
    from importlib.metadata import PackageNotFoundError, distribution
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet
    cfg = configparser.ConfigParser(delimiters=["="]); cfg.read(LIB.parent / "settings.ini")
    ini = cfg["DEFAULT"]
    low = ini["min_python"]
    refused = []
    for req in map(Requirement, shlex.split(ini["requirements"]) + ini["dev_requirements"].split()):
        try: needs = distribution(req.name).metadata.get("Requires-Python")
        except PackageNotFoundError: continue  # an optional one this environment lacks
        if needs and not SpecifierSet(needs).contains(low, prereleases=True): refused.append(f"{req.name} needs Python {needs}")
    assert not refused, f"min_python = {low}, but: {refused}"
