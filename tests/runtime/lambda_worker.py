"""A warm Lambda container for one built function, run by the Lambda runtime's own kind of Python.

Started with the function directory and the layer's `python/` on PYTHONPATH and nothing else but
boto3 (as /var/task and /opt/python are), it imports the handler once and then answers one JSON
event per line on stdin with one JSON line: {"result": ...} or the runtime's error shape. The
function's own stdout (Powertools logs and metrics) goes to stderr so it cannot mix with the answers.
This file must import nothing from the project.
"""

import importlib
import json
import os
import sys
import traceback
import uuid


class Context:
    def __init__(self, name: str) -> None:
        self.function_name = name
        self.function_version = "$LATEST"
        self.invoked_function_arn = f"arn:aws:lambda:{os.environ['AWS_REGION']}:123456789012:function:{name}"
        self.memory_limit_in_mb = 1024
        self.aws_request_id = str(uuid.uuid4())
        self.log_group_name = f"/aws/lambda/{name}"
        self.log_stream_name = "shipped-artifact-test"

    def get_remaining_time_in_millis(self) -> int:
        return 300_000


def main() -> None:
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    module_name, _, function_name = sys.argv[1].rpartition(".")
    try:
        handler = getattr(importlib.import_module(module_name), function_name)
    except BaseException as exc:  # the import failure is the answer to every event
        handler = None
        import_error = exc
    for line in sys.stdin:
        context = Context(os.environ["AWS_LAMBDA_FUNCTION_NAME"])
        try:
            if handler is None:
                raise import_error
            answer = {"result": handler(json.loads(line), context)}
        except Exception as exc:
            answer = {
                "errorType": type(exc).__name__,
                "errorMessage": str(exc),
                "stackTrace": traceback.format_exception(exc)[-4:],
            }
        answers.write(json.dumps(answer, default=str) + "\n")


if __name__ == "__main__":
    main()
