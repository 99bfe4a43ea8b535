"""A local sagemaker-runtime endpoint that forwards to the hosting emulator's processes.

boto3 reaches it through `AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME`, so the eval's code is the code
that runs on AWS: `invoke_endpoint` and `invoke_endpoint_with_response_stream` (answered in AWS
event-stream framing, PayloadPart by PayloadPart as the container writes). Errors take the
service's shapes: ValidationError for an unknown or not-InService endpoint, ModelError (424, with
OriginalStatusCode / OriginalMessage / LogStreamArn) for a container's non-2xx, ThrottlingException,
a ModelStreamError event when the container breaks off a stream.
"""

from __future__ import annotations

import http.client
import re
import threading
from http.server import ThreadingHTTPServer
from typing import Any

from modeldrop.local.emulator.autoscaling import driving as autoscaling
from modeldrop.local.emulator.sagemaker import eventstream
from modeldrop.local.emulator.sagemaker.component_scaling import NO_CAPACITY_MESSAGE
from modeldrop.local.emulator.sagemaker.hosted import HostedEndpoint
from modeldrop.local.emulator.sagemaker.hosting import LocalHosting
from modeldrop.local.engines.http_base import StreamingJSONHandler
from modeldrop.local.engines.reference_engine import ADAPTER_HEADER

COMPONENT_HEADER = "X-Amzn-SageMaker-Inference-Component"
COMPONENT_REQUIRED = (
    "Inference Component Name header is required for endpoints to which you plan to deploy inference components. "
    "Please include Inference Component Name header or consider using SageMaker models."
)
_ROUTE = re.compile(r"^/endpoints/([^/]+)/(invocations|invocations-response-stream)$")
TIMEOUT_MESSAGE = (
    "Your invocation timed out while waiting for a response from container primary. Review the latency metrics "
    "for each container in Amazon CloudWatch, resolve the issue, and try again."
)


class LocalRuntime:
    def __init__(
        self,
        hosting: LocalHosting,
        invocation_timeout: float = 60.0,
        max_part_bytes: int | None = None,
    ) -> None:
        self.hosting = hosting
        self.invocation_timeout = invocation_timeout
        self.max_part_bytes = max_part_bytes
        runtime = self

        class Handler(_Handler):
            owner = runtime

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}"

    def start(self) -> LocalRuntime:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def log_stream_arn(self, hosted: HostedEndpoint) -> str:
        h = self.hosting
        return f"arn:aws:logs:{h.region}:{h.account_id}:log-group:{hosted.log_group}"


class _Handler(StreamingJSONHandler):
    owner: LocalRuntime

    def log_message(self, format: str, *args: Any) -> None:
        return

    def _error(self, status: int, code: str, message: str, **extra: Any) -> None:
        self.send_json(status, {"message": message, **extra}, {"x-amzn-ErrorType": code})

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        match = _ROUTE.match(self.path.split("?")[0])
        if match is None:
            self._error(404, "UnknownOperationException", f"no such operation: {self.path}")
            return
        name, operation = match.groups()
        hosting = self.owner.hosting
        hosted = hosting.endpoints.get(name)
        if hosted is None or hosted.status != "InService":
            self._error(400, "ValidationError", f"Endpoint {name} of account {hosting.account_id} not found.")
            return
        with hosted.lock:
            throttled = hosted.throttle_left > 0
            hosted.throttle_left -= 1 if throttled else 0
        if throttled:
            self._error(400, "ThrottlingException", "Rate exceeded")
            return
        headers = {
            "Content-Type": self.headers.get("Content-Type", "application/json"),
            "Accept": self.headers.get("Accept", "*/*"),
        }
        component = self.headers.get(COMPONENT_HEADER)
        if component:
            autoscaling.drive_all()
            asleep = hosting.components.no_capacity(name, component)
            if asleep is not None:  # scaled to zero, or still waking: the wake alarm counts it
                autoscaling.record(asleep, autoscaling.NO_CAPACITY)
                self._error(400, "ValidationError", NO_CAPACITY_MESSAGE.format(name=component))
                return
            route = hosting.components.route(name, component)
            if route is None:
                self._error(400, "ValidationError", f"Inference Component {component} not found for endpoint {name}.")
                return
            hosted = route.hosted
            autoscaling.record(component, autoscaling.INVOCATIONS)
            if route.adapter:  # as SageMaker tells the container which adapter component was invoked
                headers[ADAPTER_HEADER] = route.adapter
        elif hosted.for_components:
            self._error(400, "ValidationError", COMPONENT_REQUIRED)
            return
        connection = http.client.HTTPConnection("127.0.0.1", hosted.port, timeout=self.owner.invocation_timeout)
        try:
            connection.request("POST", "/invocations", body=body, headers=headers)
            response = connection.getresponse()
            if response.status >= 300:
                self._model_error(hosted, response.status, response.read().decode(errors="replace"))
            elif operation == "invocations":
                self._plain(response)
            else:
                self._stream(response)
        except TimeoutError:
            self._model_error(hosted, 0, TIMEOUT_MESSAGE, server=True)
        except (ConnectionError, http.client.HTTPException, OSError) as exc:
            self._model_error(hosted, 0, f"connection to container failed: {exc}", server=True)
        finally:
            connection.close()

    def _model_error(self, hosted: HostedEndpoint, status: int, original: str, server: bool = False) -> None:
        kind = "server" if server or status >= 500 else "client"
        region = self.owner.hosting.region
        link = (
            f"https://{region}.console.aws.amazon.com/cloudwatch/home?region={region}#logEventViewer:"
            f"group={hosted.log_group} in account {self.owner.hosting.account_id} for more information."
        )
        self._error(
            424,
            "ModelError",
            f'Received {kind} error ({status}) from primary with message "{original}". See {link}',
            OriginalStatusCode=status,
            OriginalMessage=original,
            LogStreamArn=self.owner.log_stream_arn(hosted),
        )

    def _plain(self, response: http.client.HTTPResponse) -> None:
        raw = response.read()
        self.send_response(200)
        self.send_header("Content-Type", response.getheader("Content-Type") or "application/json")
        self.send_header("x-Amzn-Invoked-Production-Variant", "AllTraffic")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def _stream(self, response: http.client.HTTPResponse) -> None:
        self.start_chunked(
            {
                "Content-Type": "application/vnd.amazon.eventstream",
                "X-Amzn-SageMaker-Content-Type": response.getheader("Content-Type") or "text/event-stream",
                "x-Amzn-Invoked-Production-Variant": "AllTraffic",
            }
        )
        send = self.write_chunk

        step = self.owner.max_part_bytes
        try:
            while True:
                data = response.read1(65536)
                if not data:
                    break
                pieces = [data[i : i + step] for i in range(0, len(data), step)] if step else [data]
                for piece in pieces:
                    send(eventstream.payload_part(piece))
        except TimeoutError:
            send(eventstream.stream_error("ModelStreamError", TIMEOUT_MESSAGE, "ModelInvocationTimeExceeded"))
        except (http.client.HTTPException, ConnectionError, OSError) as exc:
            send(
                eventstream.stream_error(
                    "ModelStreamError", f"the model container closed the stream unexpectedly: {exc}", "StreamBroken"
                )
            )
        self.end_chunked()
