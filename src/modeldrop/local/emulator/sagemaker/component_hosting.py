"""The local hosting of inference components: a base component runs its model's engine process (as an
endpoint's model would run), and each adapter component is loaded into its base's running engine
through the SageMaker LoRA API that the containers implement (`POST /adapters` with the adapter's
name and the local path of its extracted artifact, `DELETE /adapters/<name>`). Invocations that name
an adapter component reach the base's process with `X-Amzn-SageMaker-Adapter-Identifier`."""

from __future__ import annotations

import json
import tarfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from modeldrop.checkpoint.archive.artifact_scan import extract_archive
from modeldrop.contracts import clock
from modeldrop.contracts.s3uri import parse_s3_uri
from modeldrop.local.emulator.iam.enforcement import acting_as
from modeldrop.local.emulator.sagemaker.hosted import HostedComponent
from modeldrop.serving.idle_plan import provisioning_seconds

if TYPE_CHECKING:
    from modeldrop.local.emulator.sagemaker.components import Component
    from modeldrop.local.emulator.sagemaker.hosted import HostedEndpoint


class EndpointHosting(Protocol):
    """What a component's host borrows from the endpoint hosting (`hosting.LocalHosting`):
    its processes, logs and clock, so that a base component runs exactly as an endpoint's model does."""

    endpoints: dict[str, HostedEndpoint]
    faults: frozenset[str]
    region: str

    def _advance(self, hosted: HostedEndpoint) -> None: ...

    def _create_log_stream(self, hosted: HostedEndpoint) -> None: ...

    def _flush_logs(self, hosted: HostedEndpoint) -> None: ...

    def _log(self, hosted: HostedEndpoint, line: str) -> None: ...

    def _materialize(self, name: str, container: dict[str, Any]) -> Path: ...

    def _start(self, hosted: HostedEndpoint) -> None: ...

    def _stop(self, hosted: HostedEndpoint) -> None: ...


ADAPTER_FAILED = "Failed to load the adapter into inference component {base}: {detail}"


DEFAULT_STARTUP_SECONDS = 480  # SageMaker's startup health check grace when none is set
# With slow-component-delete, a component stays Deleting this long (the emulator's clock), as large
# bases do on SageMaker while their copies drain.
SLOW_DELETE_SECONDS = 240
# With slow-wake, provisioning an instance for a scaled-in component takes this long (emulator's clock).
WAKE_STALL_SECONDS = 3 * 3600


@dataclass
class Route:
    """Where an invocation naming a component goes: the base's process, and the adapter it names."""

    hosted: HostedEndpoint
    endpoint_name: str
    adapter: str | None


class ComponentHost:
    def __init__(self, hosting: EndpointHosting) -> None:
        self.hosting = hosting
        self.bases: dict[str, HostedComponent] = {}  # base component name -> its engine process
        self.adapters: dict[str, Component] = {}  # adapter component name -> the component

    # ---- from the emulated SageMaker API ----------------------------------------------------------
    def created(self, component: Component, model_container: dict[str, Any] | None) -> None:
        if component.base is None:
            self._start_base(component, model_container or {})
        else:
            self.adapters[component.name] = component

    def status(self, component: Component) -> tuple[str, str | None]:
        if component.base is None:
            hosted = self.bases.get(component.name)
            if hosted is None:
                return "Failed", "the base inference component's container did not start"
            with hosted.lock:
                if hosted.status == "Creating":
                    self.hosting._advance(hosted)
                self.hosting._flush_logs(hosted)
                return hosted.status, hosted.failure_reason
        return self._load_adapter(component)

    def deleted(self, component: Component) -> None:
        if component.base is None:
            hosted = self.bases.pop(component.name, None)
            if hosted is not None:
                self.hosting._stop(hosted)
            return
        self.adapters.pop(component.name, None)
        base = self.bases.get(component.base)
        if base is not None and base.status == "InService":
            self._call(base, "DELETE", f"/adapters/{component.name}", None)

    # ---- copies: scaled to zero and back, a new model on the same component -------------------------
    def scale(self, component: Component, copies: int, at: datetime | None = None) -> None:
        """The copy stops (its instance released), or an instance is provisioned for a stopped one (from AT)."""
        hosted = self.bases.get(component.name)
        if hosted is None:
            return
        with hosted.lock:
            if copies == 0 and hosted.status not in ("Stopped",):
                self.hosting._stop(hosted)
                hosted.process, hosted.status = None, "Stopped"
                self.hosting._log(hosted, "modeldrop local hosting: copy stopped (0 copies); its instance released")
            elif copies > 0 and hosted.status == "Stopped":
                provision = WAKE_STALL_SECONDS if "slow-wake" in self.hosting.faults else provisioning_seconds()
                hosted.status, hosted.provisioned_at = (
                    "Provisioning",
                    (at or clock.utcnow()) + timedelta(seconds=provision),
                )
                self.hosting._log(hosted, f"modeldrop local hosting: provisioning an instance ({provision} s)")

    def running_copies(self, component: Component | str) -> int:
        """Copies that answer: a provisioned instance's container started, and its ping passed."""
        hosted = self.bases.get(component if isinstance(component, str) else component.name)
        if hosted is None:
            return 0
        with hosted.lock:
            if hosted.status == "Provisioning" and hosted.provisioned_at and clock.utcnow() >= hosted.provisioned_at:
                hosted.status, hosted.created_virtual, hosted.created_real = (
                    "Creating",
                    clock.utcnow(),
                    time.monotonic(),
                )
                self._restart(hosted)
            if hosted.status == "Creating":
                self.hosting._advance(hosted)
            self.hosting._flush_logs(hosted)
            return 1 if hosted.status == "InService" else 0

    def _restart(self, hosted: HostedComponent) -> None:
        """A new instance: the model downloaded again (the stopped one's copy went with it), then started."""
        try:
            with acting_as(None):
                hosted.model_dir = self.hosting._materialize(hosted.name, hosted.container)
            self.hosting._start(hosted)
        except Exception as exc:  # whatever stops the container fails the copy
            self.hosting._log(hosted, f"modeldrop local hosting: container did not start: {exc}")
            hosted.status, hosted.failure_reason = "Failed", f"The container for {hosted.name} did not start"

    def no_capacity(self, endpoint_name: str, component_name: str) -> str | None:
        """The base component that has no running copy for an invocation naming COMPONENT_NAME (None: it has)."""
        adapter = self.adapters.get(component_name)
        base_name = str(adapter.base) if adapter is not None else component_name
        hosted = self.bases.get(base_name)
        if hosted is None or hosted.endpoint_name != endpoint_name:
            return None
        if hosted.provisioned_at is not None:
            self.running_copies(base_name)
        if hosted.status in ("Stopped", "Provisioning") or (hosted.status == "Creating" and hosted.provisioned_at):
            return base_name
        return None

    def update_model(self, component: Component, container: dict[str, Any], spec: dict[str, Any]) -> None:
        """UpdateInferenceComponent onto a new model: the old container stops, the new one starts."""
        hosted = self.bases.get(component.name)
        if hosted is None:
            return
        with hosted.lock:
            hosted.previous = (dict(component.specification), dict(hosted.container), dict(hosted.env))
            self.hosting._stop(hosted)
            hosted.env, hosted.container = dict(container.get("Environment") or {}), container
            hosted.status, hosted.created_virtual, hosted.created_real = "Creating", clock.utcnow(), time.monotonic()
            self._restart(hosted)
        component.specification = spec

    def update_status(self, component: Component) -> tuple[str, str | None]:
        """An update in progress: InService on the new model, or rolled back onto the previous one."""
        hosted = self.bases.get(component.name)
        if hosted is None:
            return "Failed", "the inference component's container is gone"
        self.status(component)  # the new container's start, advanced as a created one's is
        with hosted.lock:
            if hosted.status == "Creating":
                return "Updating", None
            if hosted.status == "InService" or hosted.previous is None:
                hosted.previous = None
                return "InService", None
            spec, container, env = hosted.previous
            hosted.previous = None
            self.hosting._log(hosted, "modeldrop local hosting: the update failed; rolling back to the previous model")
            self.hosting._stop(hosted)
            hosted.container, hosted.env = container, env
            hosted.status, hosted.created_virtual, hosted.created_real = "Creating", clock.utcnow(), time.monotonic()
            self._restart(hosted)
        component.specification = spec
        return "InService", "The inference component update failed and was rolled back to its previous specification."

    def delete_seconds(self) -> float:
        return SLOW_DELETE_SECONDS if "slow-component-delete" in self.hosting.faults else 0.0

    # ---- from the runtime ------------------------------------------------------------------------
    def route(self, endpoint_name: str, component_name: str) -> Route | None:
        adapter = self.adapters.get(component_name)
        if adapter is not None and adapter.endpoint_name == endpoint_name and adapter.status == "InService":
            base = self.bases.get(str(adapter.base))
            return Route(base, endpoint_name, adapter.name) if base is not None else None
        hosted = self.bases.get(component_name)
        if hosted is not None and hosted.endpoint_name == endpoint_name and hosted.status == "InService":
            return Route(hosted, endpoint_name, None)
        return None

    def stop_all(self) -> None:
        for name in list(self.bases):
            self.hosting._stop(self.bases.pop(name))
        self.adapters.clear()

    # ---- the lifecycle ---------------------------------------------------------------------------
    def _start_base(self, component: Component, container: dict[str, Any]) -> None:
        endpoint = self.hosting.endpoints.get(component.endpoint_name)
        hosted = HostedComponent(
            name=component.name,
            instance_type=endpoint.instance_type if endpoint else "ml.g6.2xlarge",
            # The component's own StartupParameters, else SageMaker's default: a variant's timeouts are
            # not a component's (no document says it inherits them).
            startup_timeout=int(
                (component.specification.get("StartupParameters") or {}).get(
                    "ContainerStartupHealthCheckTimeoutInSeconds", DEFAULT_STARTUP_SECONDS
                )
            ),
            created_virtual=clock.utcnow(),
            created_real=time.monotonic(),
            fault=endpoint.fault if endpoint and endpoint.fault != "capacity" else "none",
            env=dict(container.get("Environment") or {}),
            endpoint_name=component.endpoint_name,
        )
        hosted.container = container
        self.bases[component.name] = hosted
        self.hosting._create_log_stream(hosted)
        try:
            with acting_as(None):  # SageMaker's own read of the model data
                hosted.model_dir = self.hosting._materialize(component.name, container)
            self.hosting._start(hosted)
        except Exception as exc:  # whatever stops the container is the component's failure
            self.hosting._log(hosted, f"modeldrop local hosting: container did not start: {exc}")
            hosted.status, hosted.failure_reason = "Failed", f"The container for {component.name} did not start"

    def _load_adapter(self, component: Component) -> tuple[str, str | None]:
        """Download the adapter's archive, extract it beside the base's model, register it with the
        base's engine: InService once the engine took it, Failed with the engine's answer otherwise."""
        base = self.bases.get(str(component.base))
        if base is None or base.status != "InService" or base.model_dir is None:
            return "Failed", ADAPTER_FAILED.format(base=component.base, detail="the base is not running")
        url = str(component.specification.get("Container", {}).get("ArtifactUrl"))
        target = base.model_dir.parent / "adapters" / component.name
        try:
            self._download(url, target)
        except Exception as exc:  # an unreadable or hostile archive fails the component, not the emulator
            return "Failed", ADAPTER_FAILED.format(base=component.base, detail=f"cannot read {url}: {exc}")
        status, body = self._call(base, "POST", "/adapters", {"name": component.name, "src": str(target)})
        if status != 200:
            return "Failed", ADAPTER_FAILED.format(base=component.base, detail=f"({status}) {body}")
        return "InService", None

    def _download(self, url: str, target: Path) -> None:
        import boto3

        uri = parse_s3_uri(url)
        archive = target.with_suffix(".tar.gz")
        target.parent.mkdir(parents=True, exist_ok=True)
        with acting_as(None):  # SageMaker's own read of the artifact, not the caller's
            boto3.client("s3", region_name=self.hosting.region).download_file(uri.bucket, uri.key, str(archive))
        if not tarfile.is_tarfile(archive):
            raise ValueError("not a tar archive")
        target.mkdir(parents=True, exist_ok=True)
        extract_archive(archive, target)
        archive.unlink()

    @staticmethod
    def _call(hosted: HostedEndpoint, method: str, path: str, body: dict[str, Any] | None) -> tuple[int, str]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            hosted.base_url + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return int(response.status), response.read().decode(errors="replace")
        except urllib.error.HTTPError as exc:
            return int(exc.code), exc.read().decode(errors="replace")
        except (urllib.error.URLError, OSError) as exc:
            return 0, str(exc)
