"""The deploy/ files against the code: the Grafana dashboard, Prometheus and compose.

Every metric name in every PromQL expression of the dashboard must be a series the workers
export: checked against the registry the code builds (no broker) and against a live worker's
/metrics after it folded a generated session (Kafka). prometheus.yml and compose.yaml must parse
and name the services, ports, images and commands the code has. There is no container engine
here, so the compose file is checked, not run.
"""

from __future__ import annotations

import json
import re
import shlex
import time
import tomllib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import uuid4

import httpx
import pytest
from kafka_workers import WorkerProcess, auth, publish_tree
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from sessionfold.events.envelope import encode
from sessionfold.streams.cli import COMMANDS, load_command
from sessionfold.streams.kafka.topics import Topics
from sessionfold.streams.publishing.publisher import make_producer
from sessionfold.streams.publishing.session_file import DeadLetter, read_session_file
from sessionfold.streams.tools.synthetic import write_fleet
from sessionfold.streams.web.live_contract import LiveMetrics
from sessionfold.streams.worker.prometheus import FleetCollector, FleetSnapshot, create

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "sessionfold.json"
DATASOURCES = DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml"
PROVIDERS = DEPLOY / "grafana" / "provisioning" / "dashboards" / "sessionfold.yml"
PROMETHEUS = DEPLOY / "prometheus" / "prometheus.yml"
COMPOSE = DEPLOY / "compose.yaml"
DOCKERFILE = DEPLOY / "Dockerfile"

WORKER_READY_TIMEOUT_S = 90.0
FOLD_TIMEOUT_S = 120.0


# --- a YAML reader for the deploy files ---------------------------------------------------------


def load_yaml(path: Path) -> Any:
    """The document in `path`: PyYAML's reading when it is installed, else `mini_yaml`'s."""
    try:
        import yaml  # type: ignore[import-untyped]
    except ImportError:
        return mini_yaml(path.read_text())
    return yaml.safe_load(path.read_text())


def mini_yaml(text: str) -> Any:
    """Read the block-style YAML subset the deploy files are written in.

    Mappings, sequences (of scalars or mappings), one-line flow sequences, plain and quoted
    scalars, comments. No anchors, tags, multi-line scalars or flow mappings: a file using them
    fails here loudly, which keeps the deploy files readable without PyYAML.
    """
    lines: list[tuple[int, str]] = []
    for raw in text.splitlines():
        content = _strip_comment(raw).rstrip()
        if content.strip():
            if "\t" in raw[: len(raw) - len(raw.lstrip())]:
                raise ValueError(f"tab indentation: {raw!r}")
            lines.append((len(content) - len(content.lstrip()), content.strip()))
    value, end = _block(lines, 0, lines[0][0] if lines else 0)
    if end != len(lines):
        raise ValueError(f"unexpected indentation at {lines[end][1]!r}")
    return value


def _strip_comment(line: str) -> str:
    quote = None
    for i, char in enumerate(line):
        if quote:
            if char == quote:
                quote = None
        elif char in "\"'" and (i == 0 or line[i - 1] in " \t:-[,"):
            quote = char
        elif char == "#" and (i == 0 or line[i - 1] in " \t"):
            return line[:i]
    return line


def _block(lines: list[tuple[int, str]], i: int, indent: int) -> tuple[Any, int]:
    if lines[i][1] == "-" or lines[i][1].startswith("- "):
        return _sequence(lines, i, indent)
    return _mapping(lines, i, indent)


def _sequence(lines: list[tuple[int, str]], i: int, indent: int) -> tuple[list[Any], int]:
    items: list[Any] = []
    while i < len(lines) and lines[i][0] == indent and lines[i][1].startswith("-"):
        rest = lines[i][1][1:].strip()
        if not rest:
            item, i = _block(lines, i + 1, lines[i + 1][0])
        elif _split_key(rest) is not None:
            # "- key: value": a mapping whose keys sit where `key` starts.
            inner = indent + len(lines[i][1]) - len(rest)
            item, i = _mapping([*lines[:i], (inner, rest), *lines[i + 1 :]], i, inner)
        else:
            item, i = _scalar(rest), i + 1
        items.append(item)
    return items, i


def _mapping(lines: list[tuple[int, str]], i: int, indent: int) -> tuple[dict[str, Any], int]:
    result: dict[str, Any] = {}
    while i < len(lines) and lines[i][0] == indent:
        split = _split_key(lines[i][1])
        if split is None:
            raise ValueError(f"expected 'key: value' at {lines[i][1]!r}")
        key, rest = split
        if key in result:
            raise ValueError(f"duplicate key {key!r}")
        i += 1
        if rest:
            result[key] = _scalar(rest)
        elif i < len(lines) and (
            lines[i][0] > indent or (lines[i][0] == indent and lines[i][1].startswith("- "))
        ):
            result[key], i = _block(lines, i, lines[i][0])
        else:
            result[key] = None
    return result, i


def _split_key(content: str) -> tuple[str, str] | None:
    if content[0] in "\"'":
        end = content.find(content[0], 1)
        key, after = content[1:end], content[end + 1 :]
        return (key, after[1:].strip()) if after.startswith(":") else None
    match = re.match(r"([^\s:#\[\]{},][^:#]*?):(?:\s+(.*))?$", content)
    return None if match is None else (match.group(1), (match.group(2) or "").strip())


def _scalar(text: str) -> Any:
    if text.startswith("[") and text.endswith("]"):
        inner = text[1:-1].strip()
        return [_scalar(part.strip()) for part in _split_flow(inner)] if inner else []
    if text[0] in "{&*!|>":
        raise ValueError(f"unsupported YAML: {text!r}")
    if text.startswith('"'):
        return json.loads(text)
    if text.startswith("'"):
        return text[1:-1].replace("''", "'")
    if text in ("true", "True", "false", "False"):
        return text.lower() == "true"
    if text in ("null", "~"):
        return None
    if re.fullmatch(r"[-+]?\d+", text):
        return int(text)
    if re.fullmatch(r"[-+]?(\d+\.\d*|\.\d+)([eE][-+]?\d+)?", text):
        return float(text)
    return text


def _split_flow(text: str) -> Iterator[str]:
    quote, start = None, 0
    for i, char in enumerate(text):
        if quote:
            quote = None if char == quote else quote
        elif char in "\"'":
            quote = char
        elif char == ",":
            yield text[start:i]
            start = i + 1
    yield text[start:]


# --- PromQL: the metric names an expression reads -------------------------------------------

_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_VARIABLES = re.compile(r"\$\{[^}]*\}|\$\w+|\[\[[^\]]*\]\]")
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGES = re.compile(r"\[[^\[\]]*\]")
# Label lists: `by (kind, le)` names labels, not metrics.
_GROUPING = re.compile(
    r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", re.IGNORECASE
)
# An identifier not glued to a number (`1e3`, `0.99`, `5m` are not names).
_IDENTIFIER = re.compile(r"(?<![\w.:])[a-zA-Z_:][\w:]*")
_KEYWORDS = frozenset(
    {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or"}
    | {"unless", "offset", "atan2", "inf", "nan"}
)


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (functions, keywords, labels left out)."""
    text = _STRINGS.sub('""', expr)
    text = _VARIABLES.sub("1", text)
    text = _MATCHERS.sub("", text)
    text = _RANGES.sub("", text)
    text = _GROUPING.sub("", text)
    names = set()
    for match in _IDENTIFIER.finditer(text):
        name = match.group(0)
        follows = text[match.end() :].lstrip()
        if follows.startswith("(") or name.lower() in _KEYWORDS:
            continue  # a function or aggregation call, or an operator keyword
        names.add(name)
    return names


def dashboard_expressions(dashboard: dict[str, Any]) -> dict[str, list[str]]:
    """Every PromQL expression of the dashboard, by panel title (template queries included)."""
    found: dict[str, list[str]] = {}
    for panel in _panels(dashboard.get("panels", [])):
        exprs = [t["expr"] for t in panel.get("targets", []) if t.get("expr")]
        found.setdefault(panel.get("title", f"panel {panel.get('id')}"), []).extend(exprs)
    for variable in dashboard.get("templating", {}).get("list", []):
        query = variable.get("query")
        if isinstance(query, dict):
            query = query.get("query")
        if variable.get("type") != "query" or not query:
            continue
        # Grafana's helpers wrap a selector: label_values(SELECTOR, label), query_result(EXPR).
        if re.fullmatch(r"\s*label_values\([^,]*\)\s*", query):
            continue  # label_values(label): no metric
        wrapped = re.fullmatch(r"\s*(?:label_values\((.*),[^,]*|query_result\((.*))\)\s*", query)
        if wrapped:
            query = wrapped.group(1) or wrapped.group(2)
        found.setdefault(f"variable {variable.get('name')}", []).append(query)
    return found


def _panels(panels: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))  # a collapsed row holds its panels


# --- the exported series ------------------------------------------------------------------------

#: The series a family of each type exposes (prometheus_client's text format).
_SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_sum", "_count"),
    "gaugehistogram": ("_bucket", "_gsum", "_gcount"),
    "summary": ("", "_sum", "_count"),
    "gauge": ("",),
    "info": ("_info",),
    "stateset": ("",),
    "unknown": ("",),
}


def families_of(text: str) -> dict[str, Metric]:
    """The families of a /metrics page by name (counters without `_total`, as parsed)."""
    return {family.name: family for family in text_string_to_metric_families(text)}


def family_of(series: str, families: dict[str, Metric]) -> Metric | None:
    """The family a series name belongs to, or None if no family exposes that series.

    A suffix is stripped only when the family it leaves exposes it: `x_count` belongs to the
    histogram `x`, but not to a gauge `x` (nor is a bare histogram name a series).
    """
    stripped = {series[: -len(suffix)] for suffix in _all_suffixes() if series.endswith(suffix)}
    for family_name in {series, *stripped}:
        family = families.get(family_name)
        if family is None:
            continue
        if series in {family.name + suffix for suffix in _SUFFIXES.get(family.type, ("",))}:
            return family
    return None


def _all_suffixes() -> set[str]:
    return {suffix for suffixes in _SUFFIXES.values() for suffix in suffixes if suffix}


def unknown_names(dashboard: dict[str, Any], families: dict[str, Metric]) -> dict[str, set[str]]:
    """Per panel, the metric names its expressions use that no family exposes."""
    unknown = {}
    for title, exprs in dashboard_expressions(dashboard).items():
        names = {n for expr in exprs for n in metric_names(expr) if family_of(n, families) is None}
        if names:
            unknown[title] = names
    return unknown


def code_families() -> dict[str, Metric]:
    """Every family the code registers, as a worker's /metrics shows them (no broker)."""
    registry = CollectorRegistry()
    create(registry)
    LiveMetrics.create(registry)  # the live routes' metrics, on the same registry (app.py)
    registry.register(
        FleetCollector(
            fleet=lambda: FleetSnapshot(1, 2, 0, 0, [1_500]),
            lag=lambda: {"fold": 0, "summarize": 0},
        )
    )
    return families_of(generate_latest(registry).decode())


# --- unit-level tests (no broker) ---------------------------------------------------------------


def _dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def test_metric_names_leave_out_functions_labels_and_numbers() -> None:
    """The PromQL reader finds metric names only, wherever they sit in an expression."""
    expr = (
        'histogram_quantile(0.99, sum by (le, kind) (rate(a_seconds_bucket{kind=~"x|y", '
        'le!="1e3"}[$__rate_interval] offset 5m))) / on (job) group_left (role) '
        "b:recorded > bool 1e3 unless ignoring(x) c_total and sum(d) without (e) * f[5m:1m]"
    )
    assert metric_names(expr) == {"a_seconds_bucket", "b:recorded", "c_total", "d", "f"}
    assert metric_names('sum(increase(x_total[$__range])) * 3600 + count(y{a="b"})') == {
        "x_total",
        "y",
    }


def test_family_of_strips_suffixes_only_where_the_type_exposes_them() -> None:
    """`_bucket`/`_sum`/`_count` map to a histogram, `_total` to a counter, nothing else."""
    families = code_families()
    histogram = "sessionfold_summarizer_call_duration_seconds"
    for series in (f"{histogram}_bucket", f"{histogram}_sum", f"{histogram}_count"):
        found = family_of(series, families)
        assert found is not None and found.name == histogram
    assert family_of(histogram, families) is None  # a histogram's bare name selects nothing
    assert family_of("sessionfold_events_folded", families) is None  # the counter is _total
    assert family_of("sessionfold_events_folded_total", families) is not None
    assert family_of("sessionfold_active_sessions", families) is not None
    assert family_of("sessionfold_active_sessions_count", families) is None  # a gauge has none
    assert family_of("sessionfold_frontier_gap_tokens_bucket", families) is not None


def test_mini_yaml_reads_the_deploy_subset() -> None:
    """The fallback YAML reader handles what the deploy files use, and refuses the rest."""
    text = (
        "# comment\n"
        "a: 1\n"
        "b: 'x # not a comment'\n"
        "c:\n"
        "  - one\n"
        '  - "two: 2"\n'
        "  - key: v\n"
        "    other: [p, 'q, r', 3]\n"
        "d:\n"
        "- bare\n"
        "e: ${X:-9092}:29092  # tail\n"
        "f:\n"
    )
    assert mini_yaml(text) == {
        "a": 1,
        "b": "x # not a comment",
        "c": ["one", "two: 2", {"key": "v", "other": ["p", "q, r", 3]}],
        "d": ["bare"],
        "e": "${X:-9092}:29092",
        "f": None,
    }
    with pytest.raises(ValueError):
        mini_yaml("a: &anchor {x: 1}\n")


@pytest.mark.parametrize("path", [COMPOSE, PROMETHEUS, DATASOURCES, PROVIDERS])
def test_deploy_yaml_reads_the_same_without_pyyaml(path: Path) -> None:
    """Each deploy YAML file is in the subset `mini_yaml` reads (and agrees with PyYAML's)."""
    document = mini_yaml(path.read_text())
    assert isinstance(document, dict) and document
    try:
        import yaml  # type: ignore[import-untyped]
    except ImportError:
        return
    assert document == yaml.safe_load(path.read_text())


def test_dashboard_json_is_valid_and_every_panel_has_an_expression() -> None:
    """The dashboard parses, has unique ids, fits the grid, and every panel queries something."""
    dashboard = _dashboard()
    assert dashboard["uid"] and dashboard["title"]
    panels = list(_panels(dashboard["panels"]))
    assert panels
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    datasource_uid = load_yaml(DATASOURCES)["datasources"][0]["uid"]
    for panel in panels:
        if panel["type"] == "row":
            continue
        title = panel.get("title")
        assert title, f"panel {panel['id']} has no title"
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24 and grid["w"] > 0 and grid["h"] > 0, title
        exprs = [t.get("expr", "").strip() for t in panel.get("targets", [])]
        assert exprs and all(exprs), f"panel {title!r} has a target without an expression"
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), f"panel {title!r} repeats a refId"
        for owner in (panel, *panel["targets"]):
            assert owner["datasource"]["uid"] == datasource_uid, title
        for expr in exprs:
            assert expr.count("(") == expr.count(")"), f"unbalanced parentheses: {expr}"
            assert metric_names(expr), f"panel {title!r} selects no metric: {expr}"


def test_dashboard_covers_what_operators_need() -> None:
    """Folding, flushes, compactions, the summarizer, fleet gauges, lag, dead letters and the
    live loop's calls."""
    used = {
        n
        for exprs in dashboard_expressions(_dashboard()).values()
        for e in exprs
        for n in metric_names(e)
    }
    wanted = {
        "sessionfold_events_folded_total",
        "sessionfold_flush_requests_total",
        "sessionfold_compactions_total",
        "sessionfold_summarizer_call_duration_seconds_bucket",
        "sessionfold_summarizer_tokens_total",
        "sessionfold_summarizer_cost_dollars_total",
        "sessionfold_pending_batches",
        "sessionfold_active_sessions",
        "sessionfold_frontier_gap_tokens_bucket",
        "sessionfold_dead_letters_total",
        "sessionfold_consumer_lag_records",
        "sessionfold_live_calls_total",
        "sessionfold_live_call_seconds_bucket",
        "sessionfold_live_fail_opens_total",
    }
    assert wanted <= used, sorted(wanted - used)


def test_dashboard_uses_only_metrics_the_code_registers() -> None:
    """Every name in every expression is a series of a family in the code's registry."""
    assert unknown_names(_dashboard(), code_families()) == {}


def _subcommands() -> dict[str, Any]:
    # Typer vendors its own click, so the command objects are typed loosely here.
    # The root group loads a subcommand's module only when asked (cli/__init__.py).
    return {name: load_command(name) for name in COMMANDS}


def _worker_command() -> Any:
    return _subcommands()["worker"]


def _parse_cli(argv: list[str]) -> tuple[str, dict[str, Any]]:
    """Parse a `sessionfold SUB ...` command line with the real CLI; (SUB, its parameters)."""
    assert argv[0] == "sessionfold", argv
    command = _subcommands().get(argv[1])
    assert command is not None, f"no subcommand {argv[1]!r}"
    # make_context parses and type-checks the arguments without running the command.
    with command.make_context(argv[1], list(argv[2:])) as context:
        return argv[1], dict(context.params)


@dataclass(frozen=True)
class WorkerService:
    """A compose service that runs `sessionfold worker`."""

    name: str
    role: str
    bootstrap: str
    web_port: int


def _worker_services(compose: dict[str, Any]) -> list[WorkerService]:
    services = []
    for name, service in compose["services"].items():
        command = service.get("command")
        if isinstance(command, list) and command[:2] == ["sessionfold", "worker"]:
            _sub, params = _parse_cli([str(part) for part in command])
            services.append(
                WorkerService(name, params["role"], params["bootstrap"], params["web_port"])
            )
    return services


def test_compose_workers_run_the_real_cli_against_the_kafka_service() -> None:
    """A fold and a summarizer worker, their commands valid for `sessionfold worker`."""
    compose = load_yaml(COMPOSE)
    services = compose["services"]
    workers = _worker_services(compose)
    assert {w.role for w in workers} == {"fold", "summarize"}
    kafka = services["kafka"]
    assert kafka["image"].startswith("apache/kafka:")
    advertised = kafka["environment"]["KAFKA_ADVERTISED_LISTENERS"].split(",")
    worker_envvars = {
        envvar
        for param in _worker_command().params
        for envvar in ([param.envvar] if isinstance(param.envvar, str) else param.envvar or [])
    }
    for worker in workers:
        assert worker.role in ("fold", "summarize", "all")
        assert f"PLAINTEXT://{worker.bootstrap}" in advertised, worker
        service = services[worker.name]
        assert service["depends_on"]["kafka"]["condition"] == "service_healthy"
        assert service["build"]["dockerfile"] == "deploy/Dockerfile"
        assert (COMPOSE.parent / service["build"]["context"]).resolve() == REPO
        unknown_env = set(service.get("environment", {})) - worker_envvars
        assert not unknown_env, f"{worker.name}: the worker reads no {sorted(unknown_env)}"
    for name, service in services.items():
        command = service.get("command")
        if isinstance(command, list) and command[:2] == ["sh", "-c"]:
            for part in command[2].split("&&"):
                _parse_cli(shlex.split(part))  # every sessionfold call of a shell one-shot
        elif isinstance(command, list) and command and command[0] == "sessionfold":
            assert name in {w.name for w in workers}


def test_compose_kafka_has_the_single_node_test_settings() -> None:
    """KRaft single node with single-replica internal topics and fast groups (reference §2)."""
    environment = load_yaml(COMPOSE)["services"]["kafka"]["environment"]
    assert set(environment["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    assert environment["KAFKA_CONTROLLER_QUORUM_VOTERS"] == "1@kafka:9093"
    for key in (
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR",
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR",
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR",
    ):
        assert str(environment[key]) == "1", key
    assert str(environment["KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS"]) == "0"
    # The workers' session timeout (6 s) must be allowed by the broker.
    assert int(environment["KAFKA_GROUP_MIN_SESSION_TIMEOUT_MS"]) <= 6_000


def test_dockerfile_installs_the_project_on_python_slim() -> None:
    """python:3.11-slim, the project pip-installed, and the console script compose calls."""
    lines = [
        line.strip()
        for line in DOCKERFILE.read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    assert lines[0] == "FROM python:3.11-slim"
    assert any(re.match(r"RUN pip install \.(\s|$)", line) for line in lines)
    copied = {line.split()[1] for line in lines if line.startswith("COPY ")}
    assert {"pyproject.toml", "sessionfold"} <= copied
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["sessionfold"] == "sessionfold.streams.cli:main"


def test_prometheus_scrapes_every_worker_at_its_web_port() -> None:
    """One job per worker service, at the --web-port its command passes, path /metrics."""
    config = load_yaml(PROMETHEUS)
    targets: dict[str, int] = {}
    for job in config["scrape_configs"]:
        assert job.get("metrics_path", "/metrics") == "/metrics", job["job_name"]
        for sd in job.get("dns_sd_configs", []):
            for name in sd["names"]:
                targets[name] = sd["port"]
        for static in job.get("static_configs", []):
            for target in static["targets"]:
                host, _, port = target.rpartition(":")
                targets[host] = int(port)
    workers = {w.name: w.web_port for w in _worker_services(load_yaml(COMPOSE))}
    assert targets == workers


def test_compose_mounts_the_prometheus_and_grafana_files() -> None:
    """The mounted files exist, Grafana's provider reads where the dashboards are mounted, and
    the datasource points at the Prometheus service."""
    services = load_yaml(COMPOSE)["services"]
    mounts: dict[str, dict[str, Path]] = {}
    for name in ("prometheus", "grafana"):
        mounts[name] = {}
        for volume in services[name]["volumes"]:
            source, target = volume.split(":")[:2]
            host = (COMPOSE.parent / source).resolve()
            assert host.exists(), f"{name} mounts missing {source}"
            mounts[name][target] = host
    assert mounts["prometheus"]["/etc/prometheus/prometheus.yml"] == PROMETHEUS
    assert "--config.file=/etc/prometheus/prometheus.yml" in services["prometheus"]["command"]
    assert mounts["grafana"]["/etc/grafana/provisioning"] == DATASOURCES.parents[1]
    provider_path = load_yaml(PROVIDERS)["providers"][0]["options"]["path"]
    assert mounts["grafana"][provider_path] == DASHBOARD.parent
    home = services["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == f"{provider_path}/{DASHBOARD.name}"
    datasource = load_yaml(DATASOURCES)["datasources"][0]
    assert datasource["url"] == "http://prometheus:9090"
    assert any(str(p).endswith(":9090") for p in services["prometheus"]["ports"])


# --- against a live worker (Kafka) -------------------------------------------------------------


def _wait_for(
    condition: Callable[[], bool],
    timeout_s: float,
    what: Callable[[], str],
    worker: WorkerProcess,
) -> None:
    """Poll `condition`; fail with `what()` and the worker's log tail after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        worker._check_alive()
        if condition():
            return
        time.sleep(0.25)
    pytest.fail(f"timed out after {timeout_s:.0f}s: {what()}\n{worker.log_tail(30)}")


def _total(families: dict[str, Metric], sample: str) -> float:
    return sum(s.value for f in families.values() for s in f.samples if s.name == sample)


@pytest.fixture
def live_worker(kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> Iterator[WorkerProcess]:
    """A `sessionfold worker --role all` subprocess (tests/kafka_workers.py) on a free web port,
    with its own topic prefix and app id; stopped with SIGTERM at the end."""
    app_id = {"SESSIONFOLD_APP_ID": f"dash-{uuid4().hex[:8]}"}
    worker = WorkerProcess(kafka_bootstrap, topic_prefix, "all", 1, tmp_path, env=app_id)
    worker.start()
    try:

        def ready() -> bool:
            return "Worker ready" in worker.log_path.read_text(errors="replace")

        _wait_for(ready, WORKER_READY_TIMEOUT_S, lambda: "worker not ready", worker)
        yield worker
    finally:
        worker.stop()


@pytest.mark.kafka
def test_dashboard_names_are_served_by_a_live_worker(
    kafka_bootstrap: str, topic_prefix: str, live_worker: WorkerProcess, tmp_path: Path
) -> None:
    """After a generated session is folded (flushes, a duplicate, a dead letter), every metric
    name of the dashboard is a series the running worker serves with samples."""
    write_fleet(tmp_path / "fleet", sessions=2, turns=40, seed=7)
    envelopes = [
        r
        for p in sorted((tmp_path / "fleet").iterdir())
        for r in read_session_file(p)
        if not isinstance(r, DeadLetter)
    ]
    published = publish_tree(
        kafka_bootstrap, topic_prefix, 1, [tmp_path / "fleet"], tmp_path / "publish.json"
    )
    assert published == len(envelopes) > 0
    # A redelivered event (ignored by its sequence number) and an unreadable record, so that
    # the duplicate and dead-letter counters have samples too.
    topics = Topics(topic_prefix)
    producer = make_producer(kafka_bootstrap)
    try:
        again = envelopes[1]
        producer.send(topics.session_events, key=again.session_id.encode(), value=encode(again))
        producer.send(topics.session_events, key=b"dash-unreadable", value=b"{not an envelope")
        producer.flush()
    finally:
        producer.close()

    # The live routes (the pi extension's calls): a context call and a fail-open report, so
    # that their series have samples too.
    session_id = envelopes[0].session_id
    headers = auth(live_worker.api_token)
    body = {"leaf": None, "messages": [], "wait_ms": 20_000}
    answer = httpx.post(
        f"{live_worker.url}/sessions/{session_id}/context", json=body, headers=headers, timeout=60
    )
    assert answer.status_code == 200, answer.text
    report = {"fail_open": 1, "kind": "timeout"}
    httpx.post(
        f"{live_worker.url}/sessions/{session_id}/client-events", json=report, headers=headers
    )

    dashboard = _dashboard()
    wanted = {
        n
        for exprs in dashboard_expressions(dashboard).values()
        for e in exprs
        for n in metric_names(e)
    }
    latest: dict[str, Metric] = {}

    def settled() -> bool:
        nonlocal latest
        try:
            latest = families_of(httpx.get(f"{live_worker.url}/metrics", timeout=5.0).text)
        except httpx.HTTPError:
            return False
        served = {s.name for family in latest.values() for s in family.samples}
        folded = _total(latest, "sessionfold_events_folded_total")
        busy = _total(latest, "sessionfold_outstanding_flushes") + _total(
            latest, "sessionfold_held_events"
        )
        return folded >= len(envelopes) and busy == 0 and wanted <= served

    def what() -> str:
        served = {s.name for family in latest.values() for s in family.samples}
        return (
            f"folded {_total(latest, 'sessionfold_events_folded_total'):.0f} of "
            f"{len(envelopes)}; dashboard series without samples: {sorted(wanted - served)}"
        )

    _wait_for(settled, FOLD_TIMEOUT_S, what, live_worker)
    assert unknown_names(dashboard, latest) == {}
    for name in sorted(wanted):
        family = family_of(name, latest)
        assert family is not None and any(s.name == name for s in family.samples), name
    assert _total(latest, "sessionfold_dead_letters_total") >= 1
    assert _total(latest, "sessionfold_events_duplicate_total") >= 1
