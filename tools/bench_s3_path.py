"""What the validate function's S3 path costs, on the emulator served over HTTP (`make bench-s3`).

Generates a bf16-like .tar.gz (tools/bench_validate.py's generator) of SIZE GB, uploads it to a
moto server on loopback, then times, each in a fresh process reading the same object over HTTP:
  - a plain download: one streaming GET of the object, read to the end and dropped (the floor);
  - `modeldrop validate s3://…` with python-isal (what the Lambda layer ships);
  - the same with the stdlib's gzip forced (a layer without isal).
Prints each wall time, throughput and the ratio to the plain download.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_validate import BENCH, GB, generate

# One streaming GET read to the end, as the validate function reads an archive.
DOWNLOAD = (
    "import boto3, sys; body = boto3.client('s3').get_object(Bucket=sys.argv[1], Key=sys.argv[2])['Body'];"
    "exec('while body.read(1 << 20): pass')"
)
NO_ISAL = (
    "import sys; sys.modules['isal'] = None;"
    "from modeldrop.cli import main; sys.argv = ['modeldrop'] + sys.argv[1:]; main()"
)


def main(size_gb: float) -> int:
    path = BENCH / f"s3-{size_gb:g}GB.tar.gz"
    if not path.exists():
        BENCH.mkdir(exist_ok=True)
        generate(path, int(size_gb * GB))
    port = "5123"
    env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    os.environ.update(env)
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", port],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        import socket

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the server is up when its port answers
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", int(port))) == 0:
                    break
            time.sleep(0.2)
        import boto3

        s3 = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name="us-east-1")
        s3.create_bucket(Bucket="bench-artifacts")
        s3.upload_file(str(path), "bench-artifacts", "model.tar.gz")
        uri = "s3://bench-artifacts/model.tar.gz"
        runs = {
            "plain download": [sys.executable, "-c", DOWNLOAD, "bench-artifacts", "model.tar.gz"],
            "validate (isal)": [sys.executable, "-m", "modeldrop", "validate", uri, "--json"],
            "validate (stdlib gzip)": [sys.executable, "-c", NO_ISAL, "validate", uri, "--json"],
        }
        size = path.stat().st_size
        base = None
        for label, cmd in runs.items():
            started = time.perf_counter()
            done = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            seconds = time.perf_counter() - started
            if done.returncode not in (0, 1):
                print(f"{label}: exit {done.returncode}: {done.stderr[-500:]}")
                return 1
            base = base or seconds
            print(f"{label:24s} {seconds:7.2f} s  {size / seconds / 1e6:7.1f} MB/s  x{base / seconds:.2f} of download")
    finally:
        server.terminate()
        server.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(float(sys.argv[1]) if len(sys.argv) > 1 else 1.0))
