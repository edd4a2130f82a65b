"""The deployment artifacts in deploy/: Kubernetes manifests (schema and cross-references), Prometheus rules (promtool),
the Grafana dashboard and the alerts (only metrics the gateway really exports), and the Dockerfiles.
Each validator returns a list of problems; a negative test breaks a copy and checks the validator names the break."""
import copy, fnmatch, io, json, os, re, shlex, shutil, subprocess
from pathlib import Path
import pytest, yaml
from conftest import ROOT

DEPLOY = ROOT / "deploy"
PROMTOOL = ROOT / ".tools" / "bin" / "promtool"  # `make tools` (scripts/promtool.sh)

# ---------------------------------------------------------------- Kubernetes

def load_manifests(folder:Path) -> dict[str, list[dict]]:
    "Every YAML document of every manifest in `folder`, by file name."
    return {p.name: [d for d in yaml.safe_load_all(p.read_text()) if d] for p in sorted(folder.glob("*.yaml"))}

def _port(container:dict, port) -> int|None:
    "A port given by number or by name, as the container's port number (None if it has no such port)."
    for p in container.get("ports", []):
        if port in (p["containerPort"], p.get("name")): return p["containerPort"]
    return None

def k8s_problems(folder:Path) -> list[str]:
    "What is wrong with the manifests in `folder`: schema errors against the newest Kubernetes that kubernetes-validate "
    "bundles, and references between them that the schema cannot see."
    import kubernetes_validate as kv
    files, errs, docs = load_manifests(folder), [], []
    for name, ds in files.items():
        for d in ds:
            where = f"{name}: {d.get('kind')}/{d.get('metadata', {}).get('name')}"
            if d.get("kind") == "Kustomization":  # kustomize's own format: no Kubernetes schema; check what it lists
                res = d.get("resources", [])
                errs += [f"{name}: resource {r} does not exist" for r in res if not (folder / r).exists()]
                errs += [f"{name}: {f} is not in resources (kubectl apply -k would skip it)" for f in files if f != name and f not in res]
                continue
            try: kv.validate(d, kv.latest_version(), strict=True)
            except kv.ValidationError as e: errs.append(f"{where}: {'.'.join(map(str, e.path))}: {e.message}")
            except kv.SchemaNotFoundError as e: errs.append(f"{where}: {e.message}")
            docs.append(d)
    kinds = lambda k: [d for d in docs if d["kind"] == k]
    deps = {d["metadata"]["name"]: d for d in kinds("Deployment")}
    pvcs = {d["metadata"]["name"] for d in kinds("PersistentVolumeClaim")}
    for name, d in deps.items():
        pod, labels = d["spec"]["template"]["spec"], d["spec"]["template"]["metadata"].get("labels", {})
        if not d["spec"]["selector"].get("matchLabels", {}).items() <= labels.items():
            errs.append(f"Deployment/{name}: selector.matchLabels is not a subset of the pod labels {labels}")
        if pod.get("terminationGracePeriodSeconds", 0) < 30:
            errs.append(f"Deployment/{name}: terminationGracePeriodSeconds must be set, >= 30, to let streams drain")
        for v in pod.get("volumes", []):
            if "persistentVolumeClaim" in v and v["persistentVolumeClaim"]["claimName"] not in pvcs:
                errs.append(f"Deployment/{name}: volume {v['name']} claims {v['persistentVolumeClaim']['claimName']}, "
                            "which is not in the manifests")
        for c in pod.get("initContainers", []) + pod["containers"]:
            res = c.get("resources", {})
            for kind in ("requests", "limits"):
                for r in ("cpu", "memory"):
                    if r not in res.get(kind, {}): errs.append(f"Deployment/{name}: container {c['name']} has no {r} {kind}")
            env = {e["name"] for e in c.get("env", [])}  # $(VAR) that is not defined is passed on literally
            for var in re.findall(r"\$\((\w+)\)", " ".join(c.get("args", []) + c.get("command", []))):
                if var not in env: errs.append(f"Deployment/{name}: container {c['name']} uses $({var}) but defines no env {var}")
        ann = d["spec"]["template"]["metadata"].get("annotations", {})
        scraped = int(ann.get("prometheus.io/port", 0))
        if ann.get("prometheus.io/scrape") == "true" and not any(_port(c, scraped) for c in pod["containers"]):
            errs.append(f"Deployment/{name}: prometheus.io/port {ann.get('prometheus.io/port')} is no container port")
    for s in kinds("Service"):
        sel, sname = s["spec"].get("selector", {}), s["metadata"]["name"]
        match = [d for d in deps.values() if sel and sel.items() <= d["spec"]["template"]["metadata"].get("labels", {}).items()]
        if not match:
            errs.append(f"Service/{sname}: selector {sel} matches no Deployment's pod labels"); continue
        for sp in s["spec"]["ports"]:
            target = sp.get("targetPort", sp["port"])
            cs = [c for c in match[0]["spec"]["template"]["spec"]["containers"] if _port(c, target)]
            if not cs:
                errs.append(f"Service/{sname}: targetPort {target} is no container port of "
                            f"Deployment/{match[0]['metadata']['name']}"); continue
            c, port = cs[0], _port(cs[0], target)
            for probe, path in (("livenessProbe", "/health"), ("readinessProbe", "/ready"), ("startupProbe", "/health")):
                get = c.get(probe, {}).get("httpGet")
                if not get: errs.append(f"container {c['name']}: no {probe} httpGet"); continue
                if get.get("path") != path: errs.append(f"container {c['name']}: {probe} path is {get.get('path')}, not {path}")
                if _port(c, get.get("port")) != port: errs.append(f"container {c['name']}: {probe} port {get.get('port')} is not {port}")
            st = c.get("startupProbe", {})
            if st and st.get("periodSeconds", 10) * st.get("failureThreshold", 3) < 300:
                errs.append(f"container {c['name']}: startupProbe allows under 5 minutes to load the model")
    for h in kinds("HorizontalPodAutoscaler"):
        ref = h["spec"]["scaleTargetRef"]
        if ref.get("kind") != "Deployment" or ref.get("name") not in deps:
            errs.append(f"HorizontalPodAutoscaler/{h['metadata']['name']}: scaleTargetRef {ref.get('kind')}/{ref.get('name')} "
                        "is no Deployment here")
    return errs

def test_k8s_manifests():
    files = load_manifests(DEPLOY / "k8s")
    assert {"deployment.yaml", "service.yaml", "hpa.yaml", "kustomization.yaml"} <= set(files)
    assert (errs := k8s_problems(DEPLOY / "k8s")) == [], "\n".join(errs)

def _broken_k8s(tmp_path, kind:str, change) -> list[str]:
    "The problems of a copy of deploy/k8s whose `kind` document `change` modified."
    for name, ds in load_manifests(DEPLOY / "k8s").items():
        for d in ds:
            if d["kind"] == kind: change(d)
        (tmp_path / name).write_text(yaml.safe_dump_all(ds))
    return k8s_problems(tmp_path)

def _gw(d): return d["spec"]["template"]["spec"]["containers"][0]
@pytest.mark.parametrize("kind,change,expected", [
    ("Deployment", lambda d: _gw(d).update(livenessprobe=_gw(d)["livenessProbe"]),  # a typo only the strict schema sees
     "Additional properties are not allowed ('livenessprobe'"),
    ("Deployment", lambda d: _gw(d)["resources"].update(replicas="2"), "resources: Additional properties"),
    ("Service", lambda d: d["spec"]["selector"].update({"app.kubernetes.io/name": "other"}), "matches no Deployment's pod labels"),
    ("Service", lambda d: d["spec"]["ports"][0].update(targetPort=8080), "targetPort 8080 is no container port"),
    ("Deployment", lambda d: _gw(d)["readinessProbe"]["httpGet"].update(path="/health"), "readinessProbe path is /health, not /ready"),
    ("Deployment", lambda d: _gw(d)["livenessProbe"]["httpGet"].update(port=9000), "livenessProbe port 9000 is not 8000"),
    ("Deployment", lambda d: _gw(d)["resources"]["limits"].pop("memory"), "has no memory limits"),
    ("Deployment", lambda d: d["spec"]["template"]["spec"].update(terminationGracePeriodSeconds=10), "terminationGracePeriodSeconds"),
    ("Deployment", lambda d: _gw(d).pop("env"), "uses $(CODELLM_API_KEY) but defines no env"),
    ("HorizontalPodAutoscaler", lambda d: d["spec"]["scaleTargetRef"].update(name="codellm-old"), "scaleTargetRef Deployment/codellm-old"),
])
def test_k8s_validator_catches(tmp_path, kind, change, expected):
    errs = _broken_k8s(tmp_path, kind, change)
    assert any(expected in e for e in errs), f"expected {expected!r} in {errs}"

def test_k8s_kustomization_lists_every_manifest(tmp_path):
    shutil.copytree(DEPLOY / "k8s", tmp_path, dirs_exist_ok=True)
    (tmp_path / "extra.yaml").write_text((tmp_path / "service.yaml").read_text())
    assert any("extra.yaml is not in resources" in e for e in k8s_problems(tmp_path))

# ---------------------------------------------------------------- Prometheus and Grafana

@pytest.fixture(scope="module")
def promtool() -> str:
    if not os.access(PROMTOOL, os.X_OK): pytest.fail(f"{PROMTOOL} is missing: run `make tools` (bash scripts/promtool.sh)")
    return str(PROMTOOL)

def run_promtool(promtool, *args) -> subprocess.CompletedProcess:
    return subprocess.run([promtool, *map(str, args)], capture_output=True, text=True, timeout=120)

def test_alert_rules_check_and_unit_tests(promtool):
    r = run_promtool(promtool, "check", "rules", DEPLOY / "prometheus" / "alerts.yml")
    assert r.returncode == 0, r.stdout + r.stderr
    r = run_promtool(promtool, "test", "rules", DEPLOY / "prometheus" / "alerts_test.yml")
    assert r.returncode == 0, r.stdout + r.stderr

def test_alert_unit_tests_catch_a_changed_rule(promtool, tmp_path):
    "The unit tests pin the timing: memory alert firing after 3 minutes instead of 5 must fail them (at 4m)."
    shutil.copy(DEPLOY / "prometheus" / "alerts_test.yml", tmp_path)
    rules = (DEPLOY / "prometheus" / "alerts.yml").read_text()
    rule = "codellm_memory_used_ratio > 0.9\n        for: 5m"
    (tmp_path / "alerts.yml").write_text(rules.replace(rule, rule.replace("5m", "3m")))
    assert (tmp_path / "alerts.yml").read_text() != rules
    r = run_promtool(promtool, "test", "rules", tmp_path / "alerts_test.yml")
    assert r.returncode != 0 and "CodellmMemoryHigh" in r.stdout + r.stderr, r.stdout + r.stderr
    (tmp_path / "alerts.yml").write_text(rules.replace("codellm_replicas_healthy == 0", "codellm_replicas_healthy == = 0"))
    assert run_promtool(promtool, "check", "rules", tmp_path / "alerts.yml").returncode != 0

PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "inf", "nan"}
def promql_metrics(expr:str) -> set[str]:
    "The metric names a PromQL expression reads (not functions, labels, keywords or Grafana variables)."
    e = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', "", expr)  # strings
    e = re.sub(r"\{[^}]*\}|\[[^\]]*\]", "", e)  # label matchers, ranges
    e = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)|\boffset\s+-?\w+|\$\w+", "", e)
    names = re.findall(r"(?<![\w:.])([a-zA-Z_:][\w:]*)(?![\w:])(?!\s*\()", e)  # not followed by ( : not a function
    return set(names) - PROMQL_WORDS

def test_promql_metrics():
    assert promql_metrics('histogram_quantile(0.99, sum by (instance, le) (rate(codellm_request_seconds_bucket{le!="1"}[5m]))) > 60') \
        == {"codellm_request_seconds_bucket"}
    assert promql_metrics('sum(rate(a_total{s=~"5.."}[$__rate_interval])) / ignoring(x) sum(b) offset 5m > 1e3 and max(vllm:x)') \
        == {"a_total", "b", "vllm:x"}

@pytest.fixture(scope="module")
def gateway_names() -> set[str]:
    "The sample names the gateway's /metrics exposes, from its real registry (labelled metrics touched once)."
    from codellm_nb.serve import gateway_metrics
    m = gateway_metrics()
    for metric in vars(m).values():
        if getattr(metric, "_labelnames", None): metric.labels(*["x"] * len(metric._labelnames))
    names = {s.name for fam in m.registry.collect() for s in fam.samples}
    assert {"codellm_requests_total", "codellm_request_seconds_bucket", "codellm_replicas_healthy"} <= names
    return names

def alerts_problems(path:Path, names:set[str]) -> list[str]:
    "Alert expressions that read metrics the gateway does not export."
    rules = [r for g in yaml.safe_load(path.read_text())["groups"] for r in g["rules"]]
    return [f"alert {r.get('alert') or r.get('record')}: no gateway metric {m}"
            for r in rules for m in sorted(promql_metrics(r["expr"]) - names)] + ([] if rules else ["no rules"])

def test_alerts_read_real_metrics(gateway_names):
    assert (errs := alerts_problems(DEPLOY / "prometheus" / "alerts.yml", gateway_names)) == [], "\n".join(errs)

def test_alerts_validator_catches_a_renamed_metric(gateway_names, tmp_path):
    p = tmp_path / "alerts.yml"
    p.write_text((DEPLOY / "prometheus" / "alerts.yml").read_text().replace("codellm_replicas_healthy", "codellm_replica_healthy"))
    assert alerts_problems(p, gateway_names) == ["alert CodellmNoHealthyReplica: no gateway metric codellm_replica_healthy"]

def vllm_metric_source() -> str|None:
    "The source of vLLM's metrics, where `make vllm` installed it (None elsewhere)."
    files = sorted(ROOT.glob(".venv-vllm/lib/python*/site-packages/vllm/v1/metrics/*.py"))
    return "\n".join(f.read_text() for f in files) if files else None

def dashboard_problems(path:Path, names:set[str], vllm_src:str|None=None) -> list[str]:
    "What is wrong with a Grafana dashboard: no panels, panels without queries or datasource, metrics nobody exports."
    try: d = json.loads(path.read_text())
    except json.JSONDecodeError as e: return [f"{path.name}: not JSON: {e}"]
    errs, seen = [], set()
    panels = [p for p in d.get("panels", []) for p in [p, *p.get("panels", [])] if p.get("type") != "row"]
    if not panels: errs.append("no panels")
    variables = {v["name"] for v in d.get("templating", {}).get("list", [])}
    if d.get("schemaVersion", 0) < 36: errs.append(f"schemaVersion {d.get('schemaVersion')} is older than Grafana 9")
    exprs = [(f"variable {v['name']}", re.sub(r"label_values\((\w+),.*", r"\1", v["definition"]))
             for v in d.get("templating", {}).get("list", []) if v.get("type") == "query"]
    for p in panels:
        if not p.get("targets"): errs.append(f"panel {p.get('title')!r}: no queries")
        exprs += [(f"panel {p.get('title')!r}", t.get("expr", "")) for t in p.get("targets", [])]
        for ds in [p.get("datasource")] + [t.get("datasource") for t in p.get("targets", [])]:
            uid = (ds or {}).get("uid", "")
            if not re.fullmatch(r"\$\{?(\w+)\}?", uid) or re.sub(r"\W", "", uid) not in variables:
                errs.append(f"panel {p.get('title')!r}: datasource {ds} is not a dashboard variable (DS_PROMETHEUS)")
    for where, e in exprs:
        if not e.strip(): errs.append(f"{where}: empty query")
        for m in promql_metrics(e):
            seen.add(m)
            if m.startswith("vllm:"):
                if vllm_src is not None and re.sub(r"_(total|bucket|sum|count)$", "", m) not in vllm_src:
                    errs.append(f"{where}: vLLM has no metric {m} (not in vllm/v1/metrics)")
            elif m not in names: errs.append(f"{where}: no gateway metric {m}")
    # every gateway metric is on the dashboard (histograms through their buckets, counters through _total)
    families = {re.sub(r"_(total|bucket|sum|count|created)$", "", n) for n in names}
    shown = {re.sub(r"_(total|bucket|sum|count|created)$", "", n) for n in seen}
    errs += [f"gateway metric {f} is on no panel" for f in sorted(families - shown)]
    return errs

def test_dashboard(gateway_names):
    src = vllm_metric_source()
    assert (errs := dashboard_problems(DEPLOY / "grafana" / "codellm.json", gateway_names, src)) == [], "\n".join(errs)
    text = (DEPLOY / "grafana" / "codellm.json").read_text()
    for m in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"): assert m in text

def test_dashboard_validator_catches(gateway_names, tmp_path):
    d = json.loads((DEPLOY / "grafana" / "codellm.json").read_text())
    broken = copy.deepcopy(d)
    for p in broken["panels"]:
        for t in p.get("targets", []): t["expr"] = t["expr"].replace("codellm_requests_waiting", "codellm_queue_waiting") \
                                                           .replace("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_percent")
    broken["panels"].append({"type": "timeseries", "title": "Empty", "datasource": {"uid": "prometheus-1"}})
    (p := tmp_path / "d.json").write_text(json.dumps(broken))
    errs = dashboard_problems(p, gateway_names, "vllm:kv_cache_usage_perc vllm:num_requests_running vllm:num_requests_waiting")
    for expected in ("panel 'Queue': no gateway metric codellm_queue_waiting", "vLLM has no metric vllm:gpu_cache_usage_percent",
                     "gateway metric codellm_requests_waiting is on no panel", "panel 'Empty': no queries",
                     "panel 'Empty': datasource {'uid': 'prometheus-1'} is not a dashboard variable"):
        assert any(expected in e for e in errs), f"expected {expected!r} in {errs}"
    assert dashboard_problems(p, gateway_names, None) != [] and len(errs) == 5, errs
    p.write_text("{")
    assert "not JSON" in dashboard_problems(p, gateway_names)[0]

# ---------------------------------------------------------------- Dockerfiles

BASES = {"cpu": r"python:3\.11-slim-bookworm", "cuda": r"nvidia/cuda:12\.[\d.]+-runtime-ubuntu[\d.]+",
         "rocm": r"rocm/(vllm|pytorch)(:.*)?"}

def _ignored(rel:str, patterns:list[str]) -> bool:
    "Whether .dockerignore's `patterns` drop `rel` (or a folder above it) from the build context (no ! exceptions)."
    parts = Path(rel).parts
    return any(fnmatch.fnmatch("/".join(parts[:i]), p.strip("/"))
               or (p.startswith("**/") and fnmatch.fnmatch(parts[i - 1], p.removeprefix("**/")))
               for p in patterns for i in range(1, len(parts) + 1))

def dockerfile_problems(path:Path, base:str, root:Path=ROOT) -> list[str]:
    "What is wrong with a Dockerfile of the gateway, built with `root` as its context."
    from dockerfile_parse import DockerfileParser
    df, errs = DockerfileParser(fileobj=io.BytesIO(path.read_bytes())), []
    ins = lambda name: [i["value"] for i in df.structure if i["instruction"] == name]
    if not re.fullmatch(base, df.baseimage or ""): errs.append(f"FROM {df.baseimage}: expected a base matching {base}")
    users = ins("USER")
    if not users or users[-1].split(":")[0] in ("root", "0"): errs.append(f"runs as root (USER {users[-1] if users else 'missing'})")
    if "8000" not in [p.split("/")[0] for v in ins("EXPOSE") for p in v.split()]: errs.append("does not EXPOSE 8000")
    hc = " ".join(ins("HEALTHCHECK"))
    if not re.search(r"(curl|wget|python)\b.*(127\.0\.0\.1|localhost):8000/health\b", hc):
        errs.append(f"HEALTHCHECK does not query /health on port 8000: {hc or 'missing'}")
    if ins("STOPSIGNAL")[-1:] != ["SIGTERM"]: errs.append("STOPSIGNAL is not SIGTERM")
    argv = []
    for name in ("ENTRYPOINT", "CMD"):
        if not (v := ins(name)): continue
        try: argv += json.loads(v[-1])  # exec form: python is PID 1 and gets SIGTERM itself (shell form: /bin/sh would)
        except json.JSONDecodeError: errs.append(f"{name} is in shell form: use the JSON exec form so SIGTERM reaches python")
    cmd = " ".join(argv)
    if not re.search(r"\bpython3? -m codellm_nb\.serve\b", cmd):
        errs.append(f"ENTRYPOINT/CMD does not run python -m codellm_nb.serve: {cmd!r}")
    for flag, want in (("--host", "0.0.0.0"), ("--port", "8000"), ("--model", "/models/model")):
        if not re.search(rf"{flag}[ =]{re.escape(want)}\b", cmd): errs.append(f"ENTRYPOINT/CMD lacks {flag} {want}: {cmd!r}")
    ignore = [l.strip() for l in (root / ".dockerignore").read_text().splitlines() if l.strip() and not l.startswith("#")] \
        if (root / ".dockerignore").exists() else []
    for name in ("COPY", "ADD"):
        for v in ins(name):
            args = json.loads(v) if v.startswith("[") else shlex.split(v)
            if any(a.startswith("--from") for a in args): continue  # from another stage or image
            for src in [a for a in args if not a.startswith("--")][:-1]:
                if not list(root.glob(src)): errs.append(f"{name} {src}: no such file in the repository")
                elif _ignored(src, ignore): errs.append(f"{name} {src}: excluded from the build context by .dockerignore")
    return errs

@pytest.mark.parametrize("flavor", sorted(BASES))
def test_dockerfile(flavor):
    errs = dockerfile_problems(DEPLOY / "docker" / f"Dockerfile.{flavor}", BASES[flavor])
    assert errs == [], "\n".join(errs)

def test_dockerfile_validator_catches(tmp_path):
    text = (DEPLOY / "docker" / "Dockerfile.cpu").read_text()
    bad = text.replace("USER 10001", "USER root").replace("COPY codellm_nb codellm_nb", "COPY codellm_nb nothing.txt /app/") \
              .replace('"--host", "0.0.0.0", ', "").replace("EXPOSE 8000", "EXPOSE 8080").replace("8000/health", "8000/ready")
    (p := tmp_path / "Dockerfile").write_text(bad)
    errs = dockerfile_problems(p, BASES["cuda"])
    for expected in ("FROM python:3.11-slim-bookworm: expected", "runs as root", "COPY nothing.txt: no such file", "lacks --host 0.0.0.0",
                     "does not EXPOSE 8000", "HEALTHCHECK does not query /health"):
        assert any(expected in e for e in errs), f"expected {expected!r} in {errs}"
    p.write_text(text.replace('ENTRYPOINT ["python", "-m", "codellm_nb.serve",', 'ENTRYPOINT python -m codellm_nb.serve') + "\n")
    assert any("shell form" in e for e in dockerfile_problems(p, BASES["cpu"]))
    root = tmp_path / "ctx"; shutil.copytree(ROOT / "codellm_nb", root / "codellm_nb", ignore=shutil.ignore_patterns("__pycache__"))
    for f in ("settings.ini", "setup.py", "README.md", "scripts/vllm_env.sh"):
        (root / f).parent.mkdir(exist_ok=True); shutil.copy(ROOT / f, root / f)
    (root / ".dockerignore").write_text("*.md\n")
    assert dockerfile_problems(DEPLOY / "docker" / "Dockerfile.cpu", BASES["cpu"], root) == \
        ["COPY README.md: excluded from the build context by .dockerignore"]
