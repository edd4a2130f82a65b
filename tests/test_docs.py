"The docs site: built offline from the notebooks, every page checked in headless Chromium, and each check shown to fail."
import re, shutil, time
from pathlib import Path
import pytest
from conftest import ROOT
from codellm_nb.docs import build_site, check_site, hidden_lines, project_pipeline_svg, site_pages

NBS = ROOT / "nbs"

@pytest.fixture(scope="module")
def site(tmp_path_factory):
    "The project's site, built into a temporary folder as `make docs` builds it."
    assert (NBS / "images" / "pipeline.svg").read_text() == project_pipeline_svg(NBS), "nbs/images/pipeline.svg is stale: run `make docs` and commit it"
    tmp = tmp_path_factory.mktemp("docs")
    built = build_site(NBS, out=tmp / "site", src=tmp / "src")
    print(f"site built: {built}")
    return tmp / "site", built

def test_every_page_reads_as_a_learner_sees_it(site):
    path, built = site
    shots = ROOT / "_docs" / "screenshots"
    t0 = time.time()
    got = check_site(path, NBS, screenshots=shots)
    print(f"browser checks: {got} in {time.time() - t0:.1f} s")
    every = 1 + sum(len(nbs) for nbs in site_pages(NBS).values())  # the home page and each notebook
    assert got["pages"] == built["pages"] == every >= 20 and got["internal_links"] > 100 and got["images"] >= 8
    for name in ("index", "pretrain"): assert (shots / f"{name}.png").stat().st_size > 20_000  # a page, not a blank
    core = (path / "core.html").read_text()
    assert 'id="get_preset"' in core and "In [" not in core  # rendered signatures with anchors, no prompts
    assert "cell tag_cuda" in (path / "tutorial_multinode.html").read_text()  # GPU cells marked as such

def test_a_broken_site_fails_with_each_problem_named(site, tmp_path):
    path, _ = site
    bad, nbs = tmp_path / "site", tmp_path / "nbs"
    shutil.copytree(path, bad); nbs.mkdir()
    for n in ("index.ipynb", "00_core.ipynb", "02_pretrain.ipynb"): shutil.copy(NBS / n, nbs / n)
    leak = hidden_lines(NBS / "00_core.ipynb")[0]
    def edit(page, html):
        f = bad / f"{page}.html"; f.write_text(f.read_text().replace("</article>", html + "</article>", 1))
    edit("core", f"<pre>{leak}</pre>")
    edit("pretrain", '<img src="_images/not-there.png" alt="a plot"><div class="highlight"><pre>#| hide\nx = 1</pre></div>')
    edit("index", '<a href="no-such-page.html">x</a> <a href="pretrain.html#no-such-anchor">y</a>'
                  '<script src="https://cdn.example.com/widget.js"></script>')
    with pytest.raises(AssertionError) as e: check_site(bad, nbs, search={"qwxyzzy": "pretrain"})
    msg = str(e.value)
    assert f"core.html shows a line of a hidden cell: {leak!r}" in msg
    assert "pretrain.html shows a `#|` directive: '#| hide'" in msg
    assert "searching for 'qwxyzzy' does not find pretrain.html (found: [])" in msg
    assert "pretrain.html: an image did not load" in msg and "not-there.png" in msg
    assert "index.html links to no-such-page.html, which the site does not have" in msg
    assert "index.html links to pretrain.html#no-such-anchor: that page has no such anchor" in msg
    assert re.search(r"index.html: loads https://cdn.example.com/widget.js from outside the site", msg)
    with pytest.raises(FileNotFoundError, match="make docs"): check_site(tmp_path / "nothing", nbs)

def test_the_readme_links_into_nbs():
    readme = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)#\s]+)", readme)
    local = [l for l in links if not l.startswith(("http://", "https://", "mailto:"))]
    assert local and all((ROOT / l).exists() for l in local), [l for l in local if not (ROOT / l).exists()]

def test_the_slurm_notebook_script_runs_a_notebook_as_the_howto_says(tmp_path):
    "scripts/slurm_notebook.sbatch, run as Slurm runs it (bash, SLURM_* set): parameters reach the notebook, the executed copy goes to the run."
    import json, os, subprocess
    here = tmp_path / "checkout"; (here / "nbs").mkdir(parents=True); (here / ".venv").symlink_to(ROOT / ".venv")
    cell = lambda src, **md: {"cell_type": "code", "execution_count": None, "metadata": md, "outputs": [], "source": src}
    nb = {"nbformat": 4, "nbformat_minor": 5, "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
          "cells": [cell('run_dir = "../runs/x"\npreset = "tiny"', tags=["parameters"]),
                    cell("import os, pathlib\nassert preset != 'fail', 'asked to fail'\n"
                         "pathlib.Path(run_dir, 'seen.txt').write_text(f'{preset} {os.getcwd()} {os.environ[\"OMP_NUM_THREADS\"]}')")]}
    (here / "nbs" / "probe.ipynb").write_text(json.dumps(nb))
    env = dict(os.environ, SLURM_SUBMIT_DIR=str(here), SLURM_CPUS_PER_TASK="3"); env.pop("OMP_NUM_THREADS", None)
    run = lambda *a: subprocess.run(["bash", ROOT / "scripts" / "slurm_notebook.sbatch", *a], env=env, capture_output=True, text=True, timeout=300)
    r = run("probe", tmp_path / "run", "-p", "preset", "small")
    assert r.returncode == 0, r.stderr[-2000:]
    assert (tmp_path / "run" / "seen.txt").read_text() == f"small {here / 'nbs'} 3"  # parameter, cwd, threads from Slurm's allocation
    assert (tmp_path / "run" / "notebooks" / "probe.ipynb").exists()
    r = run("probe.ipynb", tmp_path / "run2", "-p", "preset", "fail")
    assert r.returncode != 0 and "asked to fail" in (tmp_path / "run2" / "notebooks" / "probe.ipynb").read_text()  # the traceback is kept
    assert run().returncode == 2 and "usage" in run().stderr
    r = run("no_such", tmp_path / "run3")
    assert r.returncode == 2 and "no notebook nbs/no_such.ipynb" in r.stderr

def test_make_lab_opens_the_notebooks_with_the_projects_kernel():
    "`make lab` starts JupyterLab on nbs/ whose python3 kernel is the project's environment, and a notebook opens in it."
    import json, os, signal, socket, subprocess, urllib.request
    with socket.socket() as s: s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
    p = subprocess.Popen(["make", "--no-print-directory", "lab", f"LAB_ARGS=--no-browser --ip 127.0.0.1 --port {port} --IdentityProvider.token=t"],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    get = lambda path: json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}{path}?token=t", timeout=5).read())
    try:
        for _ in range(120):
            try: specs = get("/api/kernelspecs"); break
            except OSError: assert p.poll() is None, p.stdout.read()[-2000:]; time.sleep(0.5)
        else: raise AssertionError("JupyterLab did not answer within a minute")
        spec = specs["kernelspecs"][specs["default"]]["spec"]
        assert specs["default"] == "python3" and spec["argv"][0] == str(ROOT / ".venv" / "bin" / "python"), spec
        assert get("/api/contents/00_core.ipynb")["type"] == "notebook"  # it serves nbs/
    finally:
        os.killpg(p.pid, signal.SIGTERM); p.wait(30)
