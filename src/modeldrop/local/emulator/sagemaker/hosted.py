"""What the local hosting keeps of each running container: an endpoint's (or a base inference
component's) process, port, status and unflushed log lines."""

from __future__ import annotations

import hashlib
import socket
import subprocess
import threading
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class HostedEndpoint:
    name: str
    instance_type: str
    startup_timeout: int
    created_virtual: datetime
    created_real: float
    fault: str
    env: dict[str, str]
    port: int = 0
    process: subprocess.Popen[bytes] | None = None
    model_dir: Path | None = None
    status: str = "Creating"
    failure_reason: str | None = None
    unflushed: list[tuple[int, str]] = field(default_factory=list)
    throttle_left: int = 0
    for_components: bool = False  # an endpoint for inference components: it runs them, not a model
    pump: threading.Thread | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    log_lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def log_group(self) -> str:
        return f"/aws/sagemaker/Endpoints/{self.name}"

    @property
    def log_stream(self) -> str:
        return f"AllTraffic/i-{hashlib.sha256(self.name.encode()).hexdigest()[:17]}"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@dataclass
class HostedComponent(HostedEndpoint):
    """A base inference component's engine process, on its endpoint's instance."""

    endpoint_name: str = ""
    # Scaled to zero: "Stopped" (no instance); woken: "Provisioning" until this time, then started.
    provisioned_at: datetime | None = None
    container: dict[str, Any] = field(default_factory=dict)  # what a new instance downloads and runs
    previous: tuple[dict[str, Any], dict[str, Any], dict[str, str]] | None = (
        None  # (spec, container, env) before an update
    )

    @property
    def log_group(self) -> str:
        return f"/aws/sagemaker/InferenceComponents/{self.name}"
