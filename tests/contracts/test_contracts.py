"""Contracts over the files SAM deploys: ASL substitutions, error routing, template lint, schema."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from conftest import ROOT

from modeldrop.contracts.errors import DOMAIN_ERRORS
from modeldrop.local.stack.emulated import load_template

ASL = ROOT / "statemachine" / "deployment.asl.json"


def _states(definition: dict[str, Any]) -> dict[str, Any]:
    return definition["States"]


def test_every_substitution_is_defined() -> None:
    text = ASL.read_text()
    used = set(re.findall(r"\$\{([A-Za-z0-9]+)\}", text))
    template = load_template(ROOT)
    defined = set(template["Resources"]["DeploymentStateMachine"]["Properties"]["DefinitionSubstitutions"])
    assert used == defined, (used - defined, defined - used)


def test_every_domain_error_is_routed() -> None:
    definition = json.loads(ASL.read_text())
    routed: set[str] = set()
    for state in _states(definition).values():
        for block in state.get("Catch", []) + state.get("Retry", []):
            routed.update(block["ErrorEquals"])
    # TeardownIncomplete only ever reaches the teardown state's catch-all; StepContractViolated (a
    # malformed payload) can come from any step and is the catch-all's by design.
    missing = {cls.__name__ for cls in DOMAIN_ERRORS} - routed - {"TeardownIncomplete", "StepContractViolated"}
    assert not missing, f"domain errors not named in any Catch/Retry: {missing}"


def test_every_task_has_timeout_and_lambda_retry() -> None:
    definition = json.loads(ASL.read_text())
    for name, state in _states(definition).items():
        if state["Type"] != "Task":
            continue
        assert state.get("TimeoutSeconds"), name
        retry = state["Retry"][0]
        assert "Lambda.TooManyRequestsException" in retry["ErrorEquals"], name
        assert retry["JitterStrategy"] == "FULL", name


def test_quota_errors_are_not_retried() -> None:
    definition = json.loads(ASL.read_text())
    for name, state in _states(definition).items():
        for retry in state.get("Retry", []):
            assert "QuotaExceeded" not in retry["ErrorEquals"], name


def test_every_lambda_task_waits_out_a_cold_function_and_never_an_image_that_cannot_start() -> None:
    """What Lambda answers while it restores an Inactive function (initializing, Pending) is retried for
    minutes on every Lambda task; CodeArtifactUserFailedException (the image needs a new deploy) never is."""
    definition = json.loads(ASL.read_text())
    tasks = {n: s for n, s in _states(definition).items() if s.get("Type") == "Task" and "lambda" in s["Resource"]}
    assert "EngineCheck" in tasks
    for name, state in tasks.items():
        retried = {e: r for r in state.get("Retry", []) for e in r["ErrorEquals"]}
        for cold in ("Lambda.CodeArtifactUserPendingException", "Lambda.ResourceConflictException"):
            assert cold in retried, (name, cold)
            rule = retried[cold]
            waits = [min(rule["IntervalSeconds"] * rule["BackoffRate"] ** i, rule["MaxDelaySeconds"])
                     for i in range(rule["MaxAttempts"])]  # fmt: skip
            assert sum(waits) >= 300, (name, sum(waits))  # public reports see it clear within 40-106 s
        assert not any("CodeArtifactUserFailed" in e for e in retried), name
    # The image function's task retries nothing wholesale that would take CodeArtifactUserFailed in.
    engine_retried = {e for r in tasks["EngineCheck"].get("Retry", []) for e in r["ErrorEquals"]}
    assert not engine_retried & {"States.ALL", "States.TaskFailed"}, engine_retried


def test_committed_asl_matches_generator() -> None:
    sys.path.insert(0, str(ROOT / "tools"))
    import gen_asl

    assert json.loads(ASL.read_text()) == gen_asl.build()


def test_every_task_fails_by_its_phase_alone() -> None:
    """No Task carries a Catch of its own: each one's Catch is its phase's routing of the errors it
    names, so where a failure goes is read from the phase table, not from twelve hand-made lists."""
    sys.path.insert(0, str(ROOT / "tools"))
    import gen_asl

    definition = json.loads(ASL.read_text())
    tasks = {name: state for name, state in _states(definition).items() if state["Type"] == "Task"}
    assert len(tasks) >= 12
    for name, state in tasks.items():
        named = [e for block in state["Catch"] for e in block["ErrorEquals"] if e != "States.ALL"]
        phases = [p for p in gen_asl.PHASES.values() if gen_asl.catches(p, named) == state["Catch"]]
        assert phases, f"{name}'s Catch is not any phase's routing: {state['Catch']}"


def test_committed_schemas_match_the_model() -> None:
    sys.path.insert(0, str(ROOT / "tools"))
    import gen_schema

    assert (ROOT / "schemas" / "deployment-request.schema.json").read_text() == gen_schema.render()
    assert gen_schema.main(["--check"]) == 0


def test_template_passes_cfn_lint() -> None:
    cfn_lint = Path(sys.executable).parent / "cfn-lint"
    result = subprocess.run([str(cfn_lint), str(ROOT / "template.yaml")], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_function_dir_is_in_the_template() -> None:
    template = load_template(ROOT)
    uris = {
        # A zip function's CodeUri; an image function's Dockerfile folder (its handler's).
        Path(r["Properties"].get("CodeUri") or Path(r["Metadata"]["Dockerfile"]).parent).name
        for r in template["Resources"].values()
        if r["Type"] == "AWS::Serverless::Function"
    }
    assert uris == {p.name for p in (ROOT / "functions").iterdir() if p.is_dir() and (p / "app.py").exists()}


def test_iam_is_scoped() -> None:
    text = (ROOT / "template.yaml").read_text()
    assert re.search(r"iam:PassRole\n\s+Resource: !Ref SageMakerExecutionRoleArn", text)
    assert '"iam:PassedToService": sagemaker.amazonaws.com' in text
    template = load_template(ROOT)
    reaper = json.dumps(template["Resources"]["ReaperFunction"]["Properties"]["Policies"])
    assert "AddTags" not in reaper
    assert "aws:ResourceTag/modeldrop:managed-by" in reaper


def test_no_account_ids_or_regions_in_code() -> None:
    allowed = {
        "763104351884",
        "871362719292",
        "217643126080",
        "626614931356",
        "692866216735",
        "907027046896",
        "780543022126",
        "123456789012",
    }
    for path in list((ROOT / "src").rglob("*.py")) + list((ROOT / "functions").rglob("*.py")):
        for account in re.findall(r"(?<![\d.])\d{12}(?![\d])", path.read_text()):
            assert account in allowed, f"{path}: account id {account}"


def test_lambda_layer_requirements_match_the_package_and_exclude_cli_dependencies() -> None:
    import tomllib

    lines = (ROOT / "src" / "requirements.txt").read_text().splitlines()
    layer = {line.strip() for line in lines if line.strip() and not line.startswith("#")}
    names = {line.split(">")[0].split("=")[0].split("[")[0].strip() for line in layer}
    assert names == {"pydantic", "aws-lambda-powertools", "isal", "msgspec", "jinja2"}
    # What the dev venv runs in-process is what the layer ships (boto3 is the runtime's own).
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert set(project["dependencies"]) - {d for d in project["dependencies"] if d.startswith("boto3")} == layer


def test_sample_events_are_valid_inputs() -> None:
    from modeldrop.contracts.models import DeploymentRequest
    from modeldrop.pipeline.deployment.starter import S3Object, classify_key, parse_marker

    events = ROOT / "events"
    for path in sorted(events.glob("direct-start*.json")):
        DeploymentRequest.model_validate_json(path.read_text())
    for path in sorted(events.glob("modeldrop-marker*.json")):
        parse_marker(path.read_bytes(), f"events/{path.name}")
    for path in sorted(events.glob("s3-object-created-*.json")):
        _bucket, obj = S3Object.from_event(json.loads(path.read_text()))
        assert classify_key(obj.key) is not None, path


def test_dashboard_and_alarm_metrics_are_emitted_by_the_code() -> None:
    import re

    template = (ROOT / "template.yaml").read_text()
    code = "\n".join(p.read_text() for p in [*ROOT.glob("functions/*/app.py"), *ROOT.glob("src/modeldrop/**/*.py")])
    metrics = set(re.findall(r'\["modeldrop", "(\w+)"', template)) | set(re.findall(r'\[".", "(\w+)"', template))
    metrics.add(re.search(r"MetricName: (\w+)", template).group(1))  # type: ignore[union-attr]
    assert {"DeploymentsSucceeded", "ValidationMBps", "EvalTTFTP50", "OverdueEndpoints"} <= metrics
    for metric in metrics:
        stem = re.sub(r"P(50|90)$", "", metric)
        emitted = (
            f'name="{metric}"' in code
            or f'"{stem}": (' in code  # the eval report's p50/p90 series
            or (metric.startswith("Deployments") and 'name=f"Deployments{' in code)
        )
        assert emitted, metric


def test_lambda_retries_cover_every_transient_lambda_error() -> None:
    definition = json.loads(ASL.read_text())
    transient = {
        "Lambda.ServiceException",
        "Lambda.AWSLambdaException",
        "Lambda.SdkClientException",
        "Lambda.TooManyRequestsException",
        "Lambda.ClientExecutionTimeoutException",
    }
    for name, state in _states(definition).items():
        if state.get("Type") == "Task":
            retried = {e for block in state.get("Retry", []) for e in block["ErrorEquals"]}
            assert transient <= retried, (name, transient - retried)


def test_teardown_deletes_only_what_this_stack_tagged() -> None:
    from modeldrop.local.stack.emulated import load_template

    resources = load_template(ROOT)["Resources"]
    for logical in ("TeardownFunction", "ReaperFunction"):
        statements = resources[logical]["Properties"]["Policies"][0]["Statement"]
        deletes = [s for s in statements if "sagemaker:DeleteEndpoint" in s["Action"]]
        assert deletes and all(
            s["Condition"]["StringEquals"]["aws:ResourceTag/modeldrop:managed-by"] == {"Ref": "AWS::StackName"}
            for s in deletes
        ), logical


def test_the_starter_rule_has_a_dead_letter_queue_that_alarms() -> None:
    from modeldrop.local.stack.emulated import load_template

    resources = load_template(ROOT)["Resources"]
    rule = resources["StarterFunction"]["Properties"]["Events"]["ArtifactCreated"]["Properties"]
    assert rule["DeadLetterConfig"]["Arn"] == {"Fn::GetAtt": ["StarterDeadLetterQueue", "Arn"]}
    alarm = resources["StarterDeadLetterAlarm"]["Properties"]
    assert alarm["Dimensions"][0]["Value"] == {"Fn::GetAtt": ["StarterDeadLetterQueue", "QueueName"]}


def _template_functions() -> dict[str, Any]:
    from modeldrop.local.stack.emulated import load_template

    resources = load_template(ROOT)["Resources"]
    return {k: v for k, v in resources.items() if v["Type"] == "AWS::Serverless::Function"}


def test_every_task_outlasts_its_lambda() -> None:
    """A Task timeout equal to its Lambda's lets either timer fire first: the Task's is longer, so a
    Lambda that times out is reported as the Lambda's own error, never as States.Timeout."""
    functions = _template_functions()
    definition = json.loads(ASL.read_text())
    for name, state in _states(definition).items():
        if state["Type"] != "Task":
            continue
        logical = state["Arguments"]["FunctionName"].removeprefix("${").removesuffix("Arn}")
        lambda_timeout = int(functions[logical]["Properties"]["Timeout"])
        assert state["TimeoutSeconds"] >= lambda_timeout + 30, (name, state["TimeoutSeconds"], lambda_timeout)


def test_an_execution_stays_within_the_history_limit() -> None:
    """Standard workflows end at 25,000 history events. The worst case adds up every loop at its bound:
    each instance type's poll loop (MAX_POLLS, the Wait stretched to fit the deadline), its quota
    re-checks (MAX_QUOTA_CHECKS) and its teardown passes (deadline / recheck), for MAX_INSTANCE_TYPES;
    then a channel's promotion, its checks stretched to at most MAX_PROMOTION_CHECKS."""
    from modeldrop.aws.s3.served_copy import MAX_COPY_BATCHES, copy_batches
    from modeldrop.contracts.models import MAX_INSTANCE_TYPES
    from modeldrop.contracts.served import CopyItem
    from modeldrop.pipeline.channels.promotion_steps import MAX_PROMOTION_CHECKS
    from modeldrop.pipeline.deployment.attempts import MAX_QUOTA_CHECKS
    from modeldrop.pipeline.deployment.endpoint_steps import MAX_POLLS
    from modeldrop.pipeline.deployment.register_steps import MAX_COPY_ITEMS
    from modeldrop.pipeline.deployment.teardown import TEARDOWN_DEADLINE_SECONDS, TEARDOWN_RECHECK_SECONDS

    states = _states(json.loads(ASL.read_text()))
    # Entered and exited for every state; a Task adds scheduled, started and succeeded.
    events = {name: 2 + (3 if s["Type"] == "Task" else 0) for name, s in states.items()}

    def loop(*names: str) -> int:
        assert [states[n].get("Next") or states[n].get("Default") for n in names[:-1]] == list(names[1:]), names
        return sum(events[n] for n in names)

    poll = loop("WaitForEndpoint", "PollEndpoint", "EndpointInService")
    quota = loop("WaitForQuota", "CreateEndpoint", "EndpointCreated")
    teardown = loop("Teardown", "TeardownDone", "WaitForTeardown")
    passes = TEARDOWN_DEADLINE_SECONDS // TEARDOWN_RECHECK_SECONDS
    per_type = MAX_POLLS * poll + MAX_QUOTA_CHECKS * quota + passes * teardown + 40
    # The copy Map over a prefix of the most files a deployment takes: its iterations are its batches,
    # each one iteration started and succeeded and the CopyShard task's five events.
    items = [CopyItem(key=f"f{i:04d}.safetensors", size=1 + i % 7, etag="e") for i in range(MAX_COPY_ITEMS)]
    _ordered, batches = copy_batches(items)
    copy = len(batches) * (2 + 5) + 4
    promotion = MAX_PROMOTION_CHECKS * loop("WaitForPromotion", "CheckPromotion", "PromotionSettled")
    worst = MAX_INSTANCE_TYPES * per_type + sum(events.values()) + copy + promotion + 500  # every state, retries
    print(f"worst-case history: {worst} events ({len(batches)} copy batches, {promotion} of promotion checks)")
    assert len(batches) <= MAX_COPY_BATCHES and worst < 25_000, (len(batches), worst)


def test_the_inference_ami_table_is_botocores() -> None:
    """The AMI versions and their drivers come from botocore's SageMaker model, not from a hand-kept list."""
    sys.path.insert(0, str(ROOT / "tools"))
    import gen_host_table

    assert gen_host_table.committed_amis() == gen_host_table.amis()
    assert "al2023-ami-sagemaker-inference-gpu-4-1" in gen_host_table.amis()


def test_the_instance_tables_gpu_facts_are_ec2s() -> None:
    """GPU name, count and memory, vCPUs and RAM per type are DescribeInstanceTypes' answer (moto serves
    AWS's recorded one), and every GPU has an architecture the image checks can judge."""
    sys.path.insert(0, str(ROOT / "tools"))
    import gen_instance_table

    document = gen_instance_table.committed()
    facts = gen_instance_table.ec2_facts(list(document["instances"]))
    assert gen_instance_table.differences(document, facts) == []
    arch = json.loads((ROOT / "src/modeldrop/serving/data/host_drivers.json").read_text())["gpu_arch"]
    assert {spec["gpu"] for spec in facts.values()} <= set(arch)


def _finding_codes() -> set[str]:
    """Every finding code validation can emit, read from its source: the first argument (or the
    `code=`) of each Finding / _finding / _error / archive_refused / HeaderError, and the rule tables."""
    import ast

    from modeldrop.checkpoint.archive.archive_rules import ARCHIVE_RULES
    from modeldrop.checkpoint.validation import HEADER_HINTS

    makers = {"Finding", "_finding", "_error", "archive_refused", "HeaderError"}
    codes = set(ARCHIVE_RULES) | set(HEADER_HINTS)
    for path in (ROOT / "src" / "modeldrop" / "checkpoint").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or getattr(node.func, "id", None) not in makers:
                continue
            candidates = [kw.value for kw in node.keywords if kw.arg == "code"]
            if node.func.id != "HeaderError" and node.args:  # type: ignore[attr-defined]
                candidates.append(node.args[0])
            codes |= {c.value for c in candidates if isinstance(c, ast.Constant) and isinstance(c.value, str)}
    return codes


def test_every_finding_code_is_in_the_docs_with_its_fix() -> None:
    codes = _finding_codes()
    assert len(codes) > 40 and "TAR_GNU_PREFIX" in codes and "KV_SHARED_TENSORS_MISSING" in codes
    page = (ROOT / "docs" / "validation.md").read_text()
    table = page[page.index("## Finding codes") :]
    missing = sorted(c for c in codes if f"| `{c}` |" not in table)
    assert not missing, f"docs/validation.md's finding-code table lacks {missing}"


def test_the_deploy_guides_sagemaker_role_policy_is_the_local_stacks() -> None:
    """docs/deploying.md's policy for SageMakerExecutionRoleArn is, placeholders filled, exactly what the
    local stack's SageMaker role has (and so what the emulator's UpdateEndpoint holds a channel to)."""
    import re

    from modeldrop.local.stack.build import ACCOUNT, REGION, sagemaker_role_policy

    text = (ROOT / "docs" / "deploying.md").read_text()
    block = re.search(r"Its permissions.*?```json\n(.*?)```", text, re.S)
    assert block is not None
    filled = (
        block.group(1)
        .replace("<ArtifactBucketName>", "b")
        .replace("<region>", REGION)
        .replace("<account>", ACCOUNT)
        .replace("<ResourcePrefix>", "modeldrop")
    )
    assert json.loads(filled) == sagemaker_role_policy("b", "modeldrop")


def test_the_fault_table_is_the_fault_data() -> None:
    """docs/local-runs.md's table of --fault scenarios: one anchored row per fault, in faults.py's words."""
    from modeldrop.local.faults import FAULTS

    text = (ROOT / "docs" / "local-runs.md").read_text()
    rows = re.findall(r'^\| <a id="fault-([a-z-]+)"></a>`([a-z-]+)` \| (.*) \|$', text, flags=re.M)
    assert [(a, n) for a, n, _ in rows] == [(n, n) for n in FAULTS if n != "none"]
    assert {n: d for _, n, d in rows} == {n: d for n, d in FAULTS.items() if n != "none"}


def test_register_scalable_target_is_granted_on_any_resource_under_both_scaling_condition_keys() -> None:
    """A new target's ARN holds an id AWS makes at registration (the SAR's resource-less row): granted on a
    scalable-target/* ARN, the first registration is denied. Held to SageMaker's copy count by conditions."""
    template = load_template(ROOT)
    grants = [
        s
        for r in template["Resources"].values()
        for policy in (r.get("Properties", {}).get("Policies") or [])
        if isinstance(policy, dict)
        for s in policy.get("Statement", [])
        if "application-autoscaling:RegisterScalableTarget" in json.dumps(s.get("Action"))
    ]
    assert grants
    for statement in grants:
        assert statement["Resource"] == "*", statement
        conditions = statement["Condition"]["StringEquals"]
        assert conditions["application-autoscaling:service-namespace"] == "sagemaker"
        assert (
            conditions["application-autoscaling:scalable-dimension"] == "sagemaker:inference-component:DesiredCopyCount"
        )
