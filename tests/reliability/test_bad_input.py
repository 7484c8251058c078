"""Bad input: generated HeteroTrainJob specs through the real API server, malformed plans in the
runtime, nonsense metrics in the rebalancer and malformed HTTP API requests.

Each piece of bad input is either refused with a reason that names what is wrong, or accepted and
handled with a clear status; nothing crashes. Every generator is bounded in examples and time.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import kubernetes
import pytest
import yaml
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from tests.fakekube import FakeKube, ManualClock
from tests.operator.conftest import gpu_classes_tolerating_kwok
from tests.operator.live import Jobs, OperatorProcess, account_kubeconfig, chart_service_account, wait_for
from tests.rebalance.running_job import metrics_available, running_job
from tests.rebalance.running_job import tick as rebalance_pass

from hetero_operator import metric_names
from hetero_operator.controller import names
from hetero_operator.plan import Plan
from hetero_operator.rebalance.memory import JobMemory
from hetero_operator.rebalance.runner import Rebalancer
from hetero_operator.rebalance.settings import RebalancerSettings
from hetero_operator.testbed.cluster import Testbed
from hetero_operator.testbed.processes import free_port
from hetero_runtime.plan_client import FilePlanSource, PlanTracker

Record = Callable[..., None]
REPO = Path(__file__).resolve().parents[2]
SPEC_EXAMPLES = 50
SPEC_DEADLINE_SECONDS = 90
HANDLED_PHASES = {"Queued", "Pending", "Starting", "Running", "Succeeded", "Failed"}
ODD_TEXT = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=0, max_size=40
) | st.sampled_from(["", " ", "ÄÖÜ-ß", "名前", "a\u202eb", "\u0000", "x" * 300, "../etc", "🙂🙂"])


# --- HeteroTrainJob specs through the API server -------------------------------------------------


def spec_leaves() -> list[tuple[tuple[str, ...], str]]:
    """(path under the object, type) of every field of the CRD's schema (generated from the models)."""
    crd = yaml.safe_load((REPO / "crds" / "heterotrainjobs.heterotrain.io.yaml").read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    leaves: list[tuple[tuple[str, ...], str]] = []

    def walk(node: dict[str, Any], path: tuple[str, ...]) -> None:
        if node.get("x-kubernetes-preserve-unknown-fields"):
            # Kept as given (a pod template's fields): only its declared fields are checked.
            leaves.append((path, "free-form"))
            for key, child in node.get("properties", {}).items():
                walk(child, (*path, key))
        elif node.get("type") == "object" and "properties" in node:
            leaves.append((path, "object"))
            for key, child in node["properties"].items():
                walk(child, (*path, key))
        else:
            leaves.append((path, node.get("type", "object")))

    walk(schema, ("spec",))
    return leaves


LEAVES = spec_leaves()
WRONG_BY_TYPE: dict[str, st.SearchStrategy[Any]] = {
    "integer": st.integers(max_value=-1)
    | st.integers(min_value=10**9, max_value=10**30)
    | st.sampled_from(["eight", 1.5, [], {}, True]),
    "number": st.floats(max_value=-1e-9, allow_nan=False, allow_infinity=False)
    | st.just(1e308)
    | st.sampled_from(["fast", [], {}, True]),
    "string": ODD_TEXT | st.integers() | st.sampled_from([[], {}, True]),
    "boolean": st.sampled_from(["yes", 1, [], {}]),
    "array": st.sampled_from(["x", {}, 5]) | st.lists(ODD_TEXT | st.integers() | st.just({}), max_size=3),
    "object": st.sampled_from(["x", [1], 5, {"bogus": 1}]),
}


@dataclass(frozen=True)
class Mutation:
    kind: str  # set, delete, extra, name
    path: tuple[str, ...]
    value: Any = None

    @property
    def fields(self) -> tuple[str, ...]:
        """Names of which a good error message must contain one: the field, or for a key added to an
        object the object too (a map such as batch.perGpuClassMax names itself, not the bad key)."""
        return (self.path[-1], self.path[-2]) if self.kind == "extra" else (self.path[-1],)

    def named_in(self, message: str) -> bool:
        return any(name in message for name in self.fields)

    def describe(self) -> str:
        where = ".".join(self.path)
        return f"{self.kind} {where}" + ("" if self.kind == "delete" else f" = {self.value!r:.60}")


mutations = st.one_of(
    st.sampled_from([leaf for leaf in LEAVES if leaf[1] in WRONG_BY_TYPE]).flatmap(
        lambda leaf: WRONG_BY_TYPE[leaf[1]].map(lambda v: Mutation("set", leaf[0], v))
    ),
    st.sampled_from(
        [("spec", "image"), ("spec", "gpus"), ("spec", "batch"), ("spec", "epochs"), ("spec", "gpus", "min")]
    ).map(lambda path: Mutation("delete", path)),
    st.sampled_from([p for p, t in LEAVES if t == "object"]).flatmap(
        lambda path: st.from_regex(r"[a-z][a-zA-Z]{2,12}", fullmatch=True).map(
            lambda k: Mutation("extra", (*path, k), 1)
        )
    ),
    ODD_TEXT.map(lambda name: Mutation("name", ("metadata", "name"), name)),
)


def mutated(base: dict[str, Any], mutation: Mutation) -> dict[str, Any]:
    body = json.loads(json.dumps(base))
    if mutation.kind == "name":
        body["metadata"]["name"] = mutation.value
        return body
    *parents, leaf = mutation.path
    node = body
    for key in parents:
        if not isinstance(node.get(key), dict):
            node[key] = {}
        node = node[key]
    if mutation.kind == "delete":
        node.pop(leaf, None)
    else:
        node[leaf] = mutation.value
    return body


@dataclass
class SpecBed:
    testbed: Testbed
    namespace: str
    operator: OperatorProcess
    api_url: str
    token: str
    custom: kubernetes.client.CustomObjectsApi


@pytest.fixture(scope="module")
def spec_bed(testbed: Testbed, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SpecBed]:
    """An operator under the chart's ServiceAccount, with its HTTP API, and a namespace of its own."""
    root = Path(tmp_path_factory.mktemp("bad-input"))
    namespace = f"bad-{uuid.uuid4().hex[:8]}"
    testbed.apply_objects(gpu_classes_tolerating_kwok())
    testbed.kubectl("create", "namespace", namespace)
    port = free_port()
    with chart_service_account(testbed, root / "helm") as account:
        kubeconfig = account_kubeconfig(testbed, account, root / "operator.kubeconfig")
        operator = OperatorProcess(
            testbed, root / "operator.log", kubeconfig=kubeconfig, extra_args=("--api-port", str(port))
        )
        operator.start()
        custom = kubernetes.client.CustomObjectsApi(
            kubernetes.config.new_client_from_config(str(testbed.kubeconfig))
        )
        token = str(yaml.safe_load(kubeconfig.read_text())["users"][0]["user"]["token"])
        try:
            wait_for(lambda: "indexes ready" in operator.log.read_text(), 60, "the operator to start")
            yield SpecBed(testbed, namespace, operator, f"http://127.0.0.1:{port}", token, custom)
        finally:
            Jobs(testbed, namespace).delete_all(timeout=90)
            operator.stop()
            print(f"--- operator log ---\n{operator.tail(40)}")
            testbed.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def _message(error: kubernetes.client.ApiException) -> str:
    try:
        return str(json.loads(error.body).get("message", error.body))
    except (TypeError, ValueError):
        return str(error.body)


def _valid_condition(job: dict[str, Any]) -> dict[str, Any] | None:
    conditions = (job.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == "Valid"), None)


@pytest.mark.testbed
@pytest.mark.timeout(300)
def test_generated_specs_are_refused_naming_the_field_or_handled_with_a_condition(
    spec_bed: SpecBed, record: Record
) -> None:
    jobs = Jobs(spec_bed.testbed, spec_bed.namespace)
    started = time.monotonic()
    refused: list[tuple[Mutation, str]] = []
    accepted: dict[str, Mutation] = {}
    counter = iter(range(10**6))

    @settings(
        max_examples=SPEC_EXAMPLES,
        deadline=None,
        database=None,
        phases=[Phase.generate],  # every outcome is collected and judged after; nothing to shrink
        suppress_health_check=list(HealthCheck),
    )
    @given(mutation=mutations)
    def send(mutation: Mutation) -> None:
        if time.monotonic() - started > SPEC_DEADLINE_SECONDS:
            return
        base = jobs.manifest(f"fuzz-{next(counter)}", gpus=1)
        body = mutated(base, mutation)
        try:
            created = spec_bed.custom.create_namespaced_custom_object(
                "heterotrain.io",
                "v1alpha1",
                spec_bed.namespace,
                "heterotrainjobs",
                body,
                field_validation="Strict",
            )
        except kubernetes.client.ApiException as error:
            refused.append((mutation, f"{error.status}: {_message(error)}"))
        except (ValueError, TypeError) as error:  # the client would not even encode it
            refused.append((mutation, f"client: {error}"))
        else:
            accepted[created["metadata"]["name"]] = mutation

    send()
    problems: list[str] = []
    for mutation, message in refused:
        if not mutation.named_in(message):
            problems.append(
                f"refused without naming {mutation.fields}: {mutation.describe()} -> {message:.300}"
            )

    def all_handled() -> bool:
        items = spec_bed.custom.list_namespaced_custom_object(
            "heterotrain.io", "v1alpha1", spec_bed.namespace, "heterotrainjobs"
        )["items"]
        handled = {
            item["metadata"]["name"]
            for item in items
            if _valid_condition(item) and (item.get("status") or {}).get("phase") in HANDLED_PHASES
        }
        return set(accepted) <= handled

    try:
        wait_for(all_handled, 60, "every accepted job to get a Valid condition and a phase", interval=1)
    except AssertionError as error:
        problems.append(str(error))
    items = {
        item["metadata"]["name"]: item
        for item in spec_bed.custom.list_namespaced_custom_object(
            "heterotrain.io", "v1alpha1", spec_bed.namespace, "heterotrainjobs"
        )["items"]
    }
    for name, mutation in accepted.items():
        condition = _valid_condition(items.get(name, {})) or {}
        if condition.get("status") == "False" and not mutation.named_in(condition.get("message", "")):
            problems.append(
                f"Valid=False without naming {mutation.fields}: {mutation.describe()} -> {condition}"
            )
        elif not condition:
            problems.append(f"accepted without a Valid condition: {mutation.describe()}")
    # The operator is alive and still places a valid job.
    alive = spec_bed.operator.process is not None and spec_bed.operator.process.poll() is None
    if not alive:
        problems.append("the operator process exited")
    else:
        jobs.kubectl("delete", "htj", "--all", "--wait=false")
        wait_for(lambda: not jobs.pods() or None, 60, "the fuzz jobs' pods to go")
        jobs.apply(jobs.manifest("after-fuzz", gpus=1))
        try:
            jobs.wait_phase("after-fuzz", "Running", timeout=60)
        except AssertionError as error:
            problems.append(f"no valid job placed afterwards: {error}")
    tracebacks = spec_bed.operator.log.read_text(errors="replace").count("Traceback")
    if tracebacks:
        problems.append(f"{tracebacks} tracebacks in the operator log")
    trials = len(refused) + len(accepted)
    record(
        area="bad input",
        what=f"hypothesis-generated HeteroTrainJob specs sent through the API server ({len(refused)} "
        f"refused, {len(accepted)} accepted): wrong types, out-of-range and huge numbers, missing and "
        "unknown fields, odd unicode names",
        trials=trials,
        survived=trials
        - len([p for p in problems if "refused without" in p or "Valid=False" in p or "accepted" in p]),
        lost="nothing" if not problems else "; ".join(problems)[:2000],
        checks="refused with a message naming the field, or accepted and given a Valid condition (naming "
        "the field when False) and a phase; the operator stays up without tracebacks and places a valid "
        "job after",
    )
    assert trials >= SPEC_EXAMPLES // 2, f"only {trials} specs sent before the deadline"
    assert not problems, problems


# --- specs the schema accepts but nobody can honour ------------------------------------------------


@dataclass(frozen=True)
class Impossible:
    """A schema-valid spec change that cannot run, and the words its condition must contain."""

    what: str
    spec: dict[str, Any]
    condition: str  # Valid (refused by the operator) or Placed (waits, saying why)
    names: tuple[str, ...]


impossible_specs = st.one_of(
    st.from_regex(r"[a-z][a-z0-9]{2,10}", fullmatch=True).map(
        lambda cls: Impossible(
            f"gpuClasses [{cls}-missing]", {"gpuClasses": [f"{cls}-missing"]}, "Placed", (f"{cls}-missing",)
        )
    ),
    st.integers(min_value=100, max_value=4096).map(
        lambda n: Impossible(
            f"gpus {n}",
            {"gpus": {"min": n, "max": n}, "batch": {"global": 8192}},
            "Placed",
            ("gpus.min", str(n)),
        )
    ),
    st.sampled_from(["RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"]).map(
        lambda var: Impossible(
            f"env {var}", {"env": [{"name": var, "value": "7"}]}, "Valid", ("spec.env", var)
        )
    ),
    st.sampled_from([2, 3, 4]).map(
        lambda size: Impossible(
            f"virtualWorkerSize {size} with gpus 5",
            {
                "gpus": {"min": 5, "max": 5},
                "parallelism": {"strategy": "hetpipe", "hetpipe": {"virtualWorkerSize": size}},
            },
            "Valid",
            ("virtualWorkerSize",),
        )
    ),
)


@pytest.mark.testbed
@pytest.mark.timeout(240)
def test_specs_the_schema_accepts_but_nobody_can_honour_get_a_condition_naming_why(
    spec_bed: SpecBed, record: Record
) -> None:
    jobs = Jobs(spec_bed.testbed, spec_bed.namespace)
    sent: dict[str, Impossible] = {}
    counter = iter(range(10**6))

    @settings(max_examples=16, deadline=None, database=None, phases=[Phase.generate])
    @given(case=impossible_specs)
    def send(case: Impossible) -> None:
        name = f"impossible-{next(counter)}"
        body = jobs.manifest(name, gpus=1)
        body["spec"].update(case.spec)
        spec_bed.custom.create_namespaced_custom_object(
            "heterotrain.io",
            "v1alpha1",
            spec_bed.namespace,
            "heterotrainjobs",
            body,
            field_validation="Strict",
        )
        sent[name] = case

    send()

    def said(item: dict[str, Any], case: Impossible) -> bool:
        conditions = {c.get("type"): c for c in (item.get("status") or {}).get("conditions") or []}
        found = conditions.get(case.condition) or {}
        return found.get("status") == "False" and all(n in found.get("message", "") for n in case.names)

    def listed() -> dict[str, dict[str, Any]]:
        items = spec_bed.custom.list_namespaced_custom_object(
            "heterotrain.io", "v1alpha1", spec_bed.namespace, "heterotrainjobs"
        )["items"]
        return {item["metadata"]["name"]: item for item in items}

    with_reason: set[str] = set()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(with_reason) < len(sent):
        items = listed()
        with_reason = {name for name, case in sent.items() if name in items and said(items[name], case)}
        time.sleep(1)
    items = listed()
    problems = [
        f"{case.what}: no {case.condition}=False naming {case.names}; status: "
        f"{json.dumps((items.get(name) or {}).get('status'))[:400]}"
        for name, case in sent.items()
        if name not in with_reason
    ]
    pods = [p for p in jobs.pods() if p["metadata"]["labels"].get(names.LABEL_JOB) in sent]
    if pods:
        problems.append(f"{len(pods)} pods created for jobs that cannot run")
    alive = spec_bed.operator.process is not None and spec_bed.operator.process.poll() is None
    if not alive:
        problems.append("the operator process exited")
    record(
        area="bad input",
        what="hypothesis-generated specs the schema accepts but nobody can honour: unknown GPU classes, "
        "more GPUs than the cluster has, reserved env variables, a virtual-worker size no GPU count fits",
        trials=len(sent),
        survived=len(with_reason),
        lost="nothing" if not problems else "; ".join(problems)[:2000],
        checks="Valid=False (refused by the operator) or Placed=False (waits) with a message naming the "
        "field or the value; no pod created; the operator stays up",
    )
    jobs.kubectl("delete", "htj", "--all", "--wait=false")
    assert len(sent) >= 8
    assert not problems, problems


# --- malformed plans in the runtime --------------------------------------------------------------

GOOD_PLAN = Plan(version=1, world_size=3, global_batch=96, local_batches=[32, 32, 32])
PLAN_FIELDS = list(json.loads(GOOD_PLAN.to_json()))
plan_texts = st.one_of(
    st.tuples(
        st.sampled_from(PLAN_FIELDS),
        st.one_of(
            st.integers(-(10**6), -1),
            st.sampled_from(["x", None, [], {}, -0.5, 0, 1e308]),
            st.lists(st.integers(-5, 5), max_size=5),
        ),
    ).map(lambda change: json.dumps({**json.loads(GOOD_PLAN.to_json()), "version": 2, change[0]: change[1]})),
    st.sampled_from(PLAN_FIELDS).map(
        lambda drop: json.dumps(
            {k: v for k, v in json.loads(GOOD_PLAN.to_json()).items() if k != drop} | {"version": 2}
        )
    ),
    st.just(GOOD_PLAN.to_json().replace('"version": 1', '"version": 2').replace("32", "NaN", 1)),
    st.just(GOOD_PLAN.to_json()[:40]),
    ODD_TEXT,
)


def test_malformed_plans_are_refused_with_a_logged_reason_and_the_old_plan_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, record: Record
) -> None:
    path = tmp_path / "plan.json"
    outcomes: list[str] = []

    @settings(max_examples=60, deadline=None, database=None, phases=[Phase.generate])
    @given(text=plan_texts)
    def feed(text: str) -> None:
        tracker = PlanTracker(FilePlanSource(path), world_size=3, current=GOOD_PLAN)
        path.write_text(text)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="hetero_runtime.plan_client"):
            used = tracker.plan_for_epoch(5)
        try:
            parsed: Plan | None = Plan.from_json(text)
        except ValueError:
            parsed = None
        if parsed is not None and parsed.fits_world(3) is None:
            outcomes.append("ok" if used is not None else f"a valid plan was lost: {text:.80}")
            return
        reasons = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        if used != GOOD_PLAN:
            outcomes.append(f"plan replaced by malformed {text:.80}")
        elif not reasons or "keeping plan version 1" not in reasons[0]:
            outcomes.append(f"refused without a logged reason: {text:.80}")
        else:
            outcomes.append("refused")

    feed()
    lost = [o for o in outcomes if o not in ("ok", "refused")]
    record(
        area="bad input",
        what="malformed plan documents read by a worker (wrong types, negative and huge numbers, missing "
        "fields, NaN, truncated JSON, odd text)",
        trials=len(outcomes),
        survived=len(outcomes) - len(lost),
        lost="nothing" if not lost else "; ".join(lost[:10]),
        checks="the runtime keeps its current plan and logs an error naming the reason; a document that "
        "is a valid plan for the job's world is the only one applied",
        ran_on="in process, no test bed: the runtime's plan reader over a plan file",
    )
    assert outcomes.count("refused") >= 30
    assert not lost, lost


# --- nonsense metrics in the rebalancer ----------------------------------------------------------

WORLD = 3
STEPS = 100


def prometheus_answers(
    per_rank: dict[int, dict[str, float | str]],
) -> Callable[[httpx.Request], httpx.Response]:
    """Prometheus's HTTP API answering the rebalancer's queries from `per_rank` values."""
    keys = {
        metric_names.STEP_COMPUTE_SECONDS: "compute",
        metric_names.STEP_SYNC_START_SECONDS: "sync",
        metric_names.STEP_COMM_SECONDS: "comm",
    }

    def answer(request: httpx.Request) -> httpx.Response:
        query = request.url.params["query"]
        if query.startswith("max by"):
            labels = {metric_names.LABEL_NAMESPACE: "ns", metric_names.LABEL_JOB: "job"}
            rows = [{"metric": labels, "value": [0, "5"]}]
        elif query.startswith(f"sum by ({metric_names.LABEL_NAMESPACE}"):
            rows = []
        elif query.startswith("max(") or query.startswith("time()"):
            value = "1" if query.startswith("time()") else "5"
            rows = [{"metric": {}, "value": [0, value]}]
        elif query.startswith("sum(rate("):
            rows = [{"metric": {}, "value": [0, "100"]}]
        else:
            # Means divide a histogram's _sum by its _count; the step count asks for the _count alone.
            key = (
                next((k for name, k in keys.items() if name in query), "step") if "_sum" in query else "steps"
            )
            rows = [
                {"metric": {metric_names.LABEL_RANK: str(rank)}, "value": [0, str(values[key])]}
                for rank, values in per_rank.items()
                if key in values
            ]
        return httpx.Response(
            200, json={"status": "success", "data": {"resultType": "vector", "result": rows}}
        )

    return answer


BAD_VALUES = st.sampled_from(["NaN", "+Inf", "-Inf", -0.5, -1e9, 0])
rank_values = st.fixed_dictionaries(
    {
        "compute": st.floats(0.01, 1.0),
        "sync": st.floats(0.0, 0.1),
        "comm": st.floats(0.0, 0.1),
        "step": st.floats(0.05, 2.0),
        "steps": st.just(STEPS),
    }
)


@st.composite
def broken_measurements(draw: st.DrawFn) -> dict[int, dict[str, float | str]]:
    per_rank = {rank: draw(rank_values) for rank in range(WORLD)}
    rank = draw(st.integers(0, WORLD - 1))
    kind = draw(st.sampled_from(["value", "missing rank", "missing series"]))
    if kind == "missing rank":
        del per_rank[rank]
    elif kind == "missing series":
        del per_rank[rank][draw(st.sampled_from(["sync", "comm", "step"]))]
    else:
        field = draw(st.sampled_from(["compute", "sync", "comm", "step"]))
        value = draw(BAD_VALUES)
        if value == 0 and field != "compute":
            value = "NaN"  # zero sync or comm time is legitimate; zero compute is not
        per_rank[rank][field] = value
    return per_rank


def test_nonsense_metrics_are_refused_with_a_reason_and_no_plan_is_written(record: Record) -> None:
    plan = Plan(version=1, world_size=WORLD, global_batch=96, local_batches=[32, 32, 32])
    outcomes: list[str] = []

    async def tick(per_rank: dict[int, dict[str, float | str]]) -> tuple[Any, FakeKube]:
        kube = FakeKube()
        running_job(kube, plan)
        kube.requests.clear()
        transport = httpx.MockTransport(prometheus_answers(per_rank))
        async with httpx.AsyncClient(transport=transport) as http:
            settings = RebalancerSettings(prometheus_url="http://prometheus.invalid")
            rebalancer = Rebalancer(kube, http, settings, ManualClock())
            decision = await rebalance_pass(rebalancer, http, kube, JobMemory())
        return decision, kube

    @settings(max_examples=60, deadline=None, database=None, phases=[Phase.generate])
    @given(per_rank=broken_measurements())
    def feed(per_rank: dict[int, dict[str, float | str]]) -> None:
        decision, kube = asyncio.run(tick(per_rank))
        refusal = metrics_available(kube)
        if decision is not None or kube.count("POST", "ConfigMap/") or kube.count("PATCH", "/configmaps/"):
            outcomes.append(f"decided on {per_rank}")
        elif refusal is None or refusal["status"] != "False" or "rank" not in refusal["message"]:
            outcomes.append(f"no reason naming the rank for {per_rank}: {refusal}")
        else:
            outcomes.append("refused")

    feed()
    # The same fake Prometheus with sane values does lead to a decision: the refusals are not an artefact.
    sane = {
        rank: {"compute": 0.1 * (rank + 1), "sync": 0.01, "comm": 0.01, "step": 0.5, "steps": STEPS}
        for rank in range(WORLD)
    }
    decision, kube = asyncio.run(tick(sane))
    lost = [o for o in outcomes if o != "refused"]
    record(
        area="bad input",
        what="worker metrics with NaN, infinite, negative or zero times, a missing rank or a missing series, "
        "answered by a fake of Prometheus's HTTP API to the rebalancer's queries",
        trials=len(outcomes),
        survived=len(outcomes) - len(lost),
        lost="nothing" if not lost else "; ".join(lost[:10]),
        checks="no decision and no plan written; MetricsAvailable=False with a message naming the rank; sane "
        "values through the same path do lead to a decision",
        ran_on="fakes, no test bed: an in-memory Kubernetes (FakeKube) and a fake Prometheus HTTP API "
        "(httpx.MockTransport) around the real rebalancer",
    )
    assert decision is not None and kube.patches, "sane metrics through the same path lead to a decision"
    assert not lost, lost


# --- malformed HTTP API requests -----------------------------------------------------------------


@pytest.mark.testbed
def test_malformed_api_requests_are_refused_naming_the_field(spec_bed: SpecBed, record: Record) -> None:
    base, auth = spec_bed.api_url, {"Authorization": f"Bearer {spec_bed.token}"}
    spec = {"image": "x", "gpus": {"min": 1, "max": 1}, "batch": {"global": 64}, "epochs": 1}
    cases: dict[str, tuple[str, str, Any, str]] = {
        "what-if, body not JSON": ("POST", "/api/v1/whatif", b"{not json", "body"),
        "what-if, no spec": ("POST", "/api/v1/whatif", {}, "spec"),
        "what-if, gpus.min a string": (
            "POST",
            "/api/v1/whatif",
            {"spec": {**spec, "gpus": {"min": "x", "max": 1}}},
            "min",
        ),
        "what-if, negative epochs": ("POST", "/api/v1/whatif", {"spec": {**spec, "epochs": -3}}, "epochs"),
        "what-if, unknown field": ("POST", "/api/v1/whatif", {"spec": {**spec, "bogus": 1}}, "bogus"),
        "what-if, huge batch": (
            "POST",
            "/api/v1/whatif",
            {"spec": {**spec, "batch": {"global": 10**40}}},
            "global",
        ),
        "job, bad namespace": ("GET", "/api/v1/jobs/Bad_NS!/x", None, "namespace"),
        "jobs, bad namespace query": ("GET", "/api/v1/jobs?namespace=" + "n" * 300, None, "namespace"),
    }
    wrong: dict[str, str] = {}
    for label, (method, path, payload, field) in cases.items():
        content = (
            payload if isinstance(payload, bytes) else (json.dumps(payload) if payload is not None else None)
        )
        response = httpx.request(
            method,
            base + path,
            headers={**auth, "Content-Type": "application/json"},
            content=content,
            timeout=30,
        )
        if not 400 <= response.status_code < 500 or field not in response.text:
            wrong[label] = f"{response.status_code}: {response.text[:200]}"
    record(
        area="bad input",
        what="malformed HTTP API requests from an authenticated caller: broken JSON, missing, mistyped, "
        "negative, huge and unknown fields, invalid namespaces",
        trials=len(cases),
        survived=len(cases) - len(wrong),
        lost="nothing" if not wrong else json.dumps(wrong)[:1500],
        checks="a 4xx answer whose detail names the field; never a 5xx",
    )
    assert not wrong, wrong
