"""What the validate function's S3 path costs, on the emulator served over HTTP (`make bench-s3`).

For each size (GB; default 1 and 4) a bf16-like .tar.gz (tools/bench_validate.py's generator) is
uploaded to a moto server on loopback; then, each in a fresh process reading the same object over
HTTP, with the process's own CPU time (user + sys, what a Lambda pays) taken from the kernel:
  - GET: one streaming GET read to the end and dropped (the floor);
  - inflate: the same GET through the strict gzip reader, nothing parsed (inflate's own cost);
  - validate: the step's validating pass, nothing written;
  - validate+write: the step as it runs, each member written to a served prefix as it streams.
Prints throughput, the ratio to the GET, CPU-s per GB and the CPU outside inflate (the pass's CPU
less zlib's own, inflating the same file from memory), and the largest
archive a 900 s Lambda reads at the documented Lambda S3 rate (the default of MaxArchiveGB).
With --before REV[,REV] the validate pass of those commits (git worktrees in .bench/) is timed too.
S3 is reached over HTTPS (a generated certificate), as a Lambda reaches it; --http measures plain HTTP,
where botocore also SHA-256-signs every uploaded byte.
"""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_validate import BENCH, GB, generate

ROOT = Path(__file__).resolve().parent.parent
BUCKET = "bench-artifacts"
# A Lambda of 1,769 MB (one vCPU) reads S3 at about 75-90 MB/s (AWS re:Post and the Lambda
# performance guides); the lower end, or the pass's one-vCPU rate if lower, with a quarter of the
# 900 s kept back for the last writes, retries and a cold start, gives the limit. (The pass's wall
# rate here is the emulated S3's, a Python server on the same two cores, not a Lambda's.)
LAMBDA_S3_MBPS = 75.0
LAMBDA_SECONDS = 900 * 0.75
# What a bf16 checkpoint's members weigh against its .tar.gz (the bench's archive: 1.09; real ones
# up to about 1.25).
WRITE_EXPANSION = 1.25

GET = """
import boto3, sys
body = boto3.client('s3').get_object(Bucket=sys.argv[1], Key=sys.argv[2])['Body']
while body.read(1 << 20):
    pass
"""
INFLATE = """
import boto3, sys
from modeldrop.checkpoint.archive.tar_scan import open_stream
body = boto3.client('s3').get_object(Bucket=sys.argv[1], Key=sys.argv[2])['Body']
stream = open_stream(body, True)
while stream.skip(1 << 24):
    pass
"""
VALIDATE = """
import boto3, sys
from modeldrop.aws.s3.served_writer import ServedPrefixWriter, open_pinned
from modeldrop.checkpoint.validation import validate_archive_stream
from modeldrop.contracts.artifact import Artifact
s3 = boto3.client('s3')
artifact = Artifact.parse(f's3://{sys.argv[1]}/{sys.argv[2]}')
if sys.argv[3] == 'write':
    with ServedPrefixWriter(s3, Artifact.parse(f's3://{sys.argv[1]}/modeldrop-served/bench/')) as writer:
        _scan, report = validate_archive_stream(open_pinned(s3, artifact, None), str(artifact), writer)
else:
    _scan, report = validate_archive_stream(open_pinned(s3, artifact, None), str(artifact))
assert report.tensor_count > 0, report
"""
STARTUP = "import boto3, modeldrop.aws.s3.served_writer, modeldrop.checkpoint.validation, modeldrop.cli"
# Before this change the step called the CLI's own path: `modeldrop validate s3://...`.
BEFORE = (
    "import sys; from modeldrop.cli import main; sys.argv = ['modeldrop', 'validate', sys.argv[1], '--json']; main()"
)


def _certificate(folder: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1: the bench talks HTTPS, as a Lambda talks to S3. Over
    plain HTTP botocore SHA-256-signs every uploaded byte, which it never does over TLS with a checksum."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "bench-cert.pem", folder / "bench-key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


def _wait_for(port: int) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise RuntimeError("moto_server did not start")


def _timed(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, the child's CPU seconds)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode not in (0, 1):
        raise RuntimeError(f"{cmd[:3]}: exit {done.returncode}: {done.stderr[-800:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _zlib_cpu(path: Path) -> float:
    """CPU seconds to inflate PATH with the zlib the layer ships (isal's), from memory: inflate's own cost."""
    try:
        from isal import isal_zlib as zlib_module
    except ImportError:
        import zlib as zlib_module
    started = time.process_time()
    inflater = zlib_module.decompressobj(31)
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            data = chunk
            while data:
                inflater.decompress(data, 1 << 20)
                data = inflater.unconsumed_tail
    return time.process_time() - started


def _worktree(rev: str) -> Path:
    tree = BENCH / f"before-{rev}"
    if not tree.exists():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), rev], check=True)
    return tree


def main(argv: list[str]) -> int:
    before = None
    if "--before" in argv:
        at = argv.index("--before")
        before = argv[at + 1]
        del argv[at : at + 2]
    http = "--http" in argv
    if http:
        argv.remove("--http")
    sizes = [float(s) for s in (argv[0] if argv else "1,4").split(",")]
    port = 5123
    BENCH.mkdir(exist_ok=True)
    env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": f"{'http' if http else 'https'}://127.0.0.1:{port}",
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    tls: list[str] = []
    if not http:
        cert, key_file = _certificate(BENCH)
        env["AWS_CA_BUNDLE"] = str(cert)
        tls = ["--ssl-cert", str(cert), "--ssl-key", str(key_file)]
    print(f"S3 over {'HTTP (every uploaded byte SHA-256-signed)' if http else 'HTTPS, as a Lambda reaches it'}")
    os.environ.update(env)
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port), *tls],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    slowest = None
    try:
        _wait_for(port)
        import boto3

        s3 = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name="us-east-1")
        s3.create_bucket(Bucket=BUCKET)
        for size_gb in sizes:
            path = BENCH / f"s3-{size_gb:g}GB.tar.gz"
            if not path.exists():
                BENCH.mkdir(exist_ok=True)
                generate(path, int(size_gb * GB))
            key = f"{size_gb:g}GB/model.tar.gz"
            s3.upload_file(str(path), BUCKET, key)
            size = path.stat().st_size
            runs = {
                "GET": [sys.executable, "-c", GET, BUCKET, key],
                "inflate": [sys.executable, "-c", INFLATE, BUCKET, key],
                "validate": [sys.executable, "-c", VALIDATE, BUCKET, key, "read"],
                "validate+write": [sys.executable, "-c", VALIDATE, BUCKET, key, "write"],
            }
            trees = {rev: _worktree(rev) for rev in (before.split(",") if before else [])}
            for rev in trees:
                runs[f"validate @{rev}"] = [sys.executable, "-c", BEFORE, f"s3://{BUCKET}/{key}"]
            zlib_alone = _zlib_cpu(path) / (size / 1e9)
            # A process's imports cost the same whatever the size: measured once and left out of CPU-s/GB.
            _wall, startup = _timed([sys.executable, "-c", STARTUP], env)
            print(
                f"\n{size / 1e9:.2f} GB archive ({path.name}); zlib alone, in memory: {zlib_alone:.2f} CPU-s/GB; "
                f"a process's imports: {startup:.2f} CPU-s (left out below)"
            )
            print(f"  {'pass':22s} {'wall s':>7s} {'MB/s':>7s} {'x GET':>6s} {'CPU-s/GB':>9s} {'outside zlib':>13s}")
            base = None
            for label, cmd in runs.items():
                run_env = dict(env)
                if label.startswith("validate @"):
                    run_env["PYTHONPATH"] = str(trees[label.split("@", 1)[1]] / "src")
                wall, cpu = _timed(cmd, run_env)
                base = base or wall
                per_gb = max(cpu - startup, 0.0) / (size / 1e9)
                outside = f"{per_gb - zlib_alone:13.2f}" if label != "GET" else " " * 13
                rate = size / wall / 1e6
                print(f"  {label:22s} {wall:7.2f} {rate:7.1f} {base / wall:6.2f} {per_gb:9.2f} {outside}")
                if label == "validate+write" and per_gb > 0:
                    # One vCPU (a 1,769 MB Lambda) runs this pass at 1/(CPU-s per GB) at best.
                    cpu_rate = 1e3 / per_gb
                    slowest = cpu_rate if slowest is None else min(slowest, cpu_rate)
    finally:
        server.terminate()
        server.wait()
    if slowest is not None:
        rate = min(LAMBDA_S3_MBPS, slowest)
        bound = "the network" if slowest >= LAMBDA_S3_MBPS else "the CPU"
        # Both legs cross the Lambda's network: the archive read, and its members written back
        # (WRITE_EXPANSION x the archive for bf16, which gzip barely shrinks).
        moved = 1 + WRITE_EXPANSION
        print(
            f"\none vCPU validates and writes {slowest:.0f} MB/s of archive (1 / its CPU-s per GB); a Lambda "
            f"moves S3 bytes at about {LAMBDA_S3_MBPS:g} MB/s: {bound} is the bound.\nlargest archive for a 900 s "
            f"Lambda, read and written back ({moved:g} x its size): {rate:.0f} MB/s x {LAMBDA_SECONDS:.0f} s (a "
            f"quarter of 900 s kept back) / {moved:g} = {rate * LAMBDA_SECONDS / moved / 1e3:.1f} GB; the stack's "
            "MaxArchiveGB defaults to 20"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
