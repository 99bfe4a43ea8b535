"""Step Functions in the emulator, as strict as the service: definitions Step Functions refuses
(moto's parser accepts `$eval` and an `eval` variable), a Wait's Seconds that are not a whole
non-negative number, and the execution's status-change event sent once, at once on a stop."""

# Monkeypatching moto is this module's purpose.
# mypy: disable-error-code="method-assign,assignment,unused-ignore,attr-defined,typeddict-item"
from __future__ import annotations

import json
import logging
import re
from typing import Any

_JSONATA = re.compile(r"\{%(.*?)%\}", re.S)
_EVAL = re.compile(r"\$eval\b")


def definition_problems(definition: str) -> list[str]:
    """What Step Functions refuses in a JSONata definition that moto's parser accepts."""
    problems: list[str] = []

    def walk(node: Any, where: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "Assign" and isinstance(value, dict) and "eval" in value:
                    problems.append(f"{where}: Assign names a variable 'eval' ($eval is a reserved function)")
                walk(value, f"{where}.{key}")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, f"{where}[{i}]")
        elif isinstance(node, str):
            for expression in _JSONATA.findall(node):
                if _EVAL.search(expression):
                    problems.append(f"{where}: $eval is not available in Step Functions JSONata: {node!r}")

    walk(json.loads(definition), "$")
    return problems


def _patch_stepfunctions() -> None:
    from moto.core.exceptions import AWSError
    from moto.stepfunctions.parser.api import InvalidDefinition
    from moto.stepfunctions.parser.asl.component.common.error_name.failure_event import (
        FailureEvent,
        FailureEventException,
    )
    from moto.stepfunctions.parser.asl.component.common.error_name.states_error_name import StatesErrorName
    from moto.stepfunctions.parser.asl.component.common.error_name.states_error_name_type import (
        StatesErrorNameType,
    )
    from moto.stepfunctions.parser.asl.component.state.wait.wait_function import seconds
    from moto.stepfunctions.parser.asl.eval.event.event_detail import EventDetails
    from moto.stepfunctions.parser.models import StepFunctionsParserBackend

    class InvalidDefinitionError(AWSError):
        TYPE = "InvalidDefinition"  # moto's own InvalidDefinition reaches the client with an empty code

    original_validate = StepFunctionsParserBackend._validate_definition

    def validate_definition(definition: str) -> None:
        try:
            original_validate(definition=definition)
        except InvalidDefinition as exc:
            raise InvalidDefinitionError(str(exc.message)) from None
        problems = definition_problems(definition)
        if problems:
            raise InvalidDefinitionError("; ".join(problems))

    StepFunctionsParserBackend._validate_definition = staticmethod(validate_definition)

    def whole_seconds(self: Any, env: Any) -> int:
        # moto truncates 7.5 to 7; Step Functions needs a non-negative integer and fails the state.
        self.string_jsonata.eval(env=env)
        value = env.stack.pop()
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0 or value != int(value):
            from moto.stepfunctions.parser.api import EvaluationFailedEventDetails, HistoryEventType

            name = StatesErrorName(typ=StatesErrorNameType.StatesQueryEvaluationError)
            raise FailureEventException(
                failure_event=FailureEvent(
                    env=env,
                    error_name=name,
                    event_type=HistoryEventType.EvaluationFailed,
                    event_details=EventDetails(
                        evaluationFailedEventDetails=EvaluationFailedEventDetails(
                            error=name.error_name,
                            cause=f"The Wait state's Seconds must be a non-negative integer, not {value!r}.",
                        )
                    ),
                )
            )
        return int(value)

    seconds.SecondsJSONata._get_wait_seconds = whole_seconds


def _patch_execution_events() -> None:
    """The execution's status-change event, once per execution: at the end of a run -- or, for a
    StopExecution, at once, while a Lambda task it started may still be running, as on AWS (moto
    would only mark the execution ABORTED when that task returns)."""
    from moto.events.models import events_backends
    from moto.stepfunctions.parser.api import ExecutionStatus
    from moto.stepfunctions.parser.backend import execution as sfn_execution

    from modeldrop.contracts.models import epoch_ms

    def announce(ex: Any) -> None:
        if getattr(ex, "_modeldrop_announced", False):
            return
        ex._modeldrop_announced = True
        detail = {
            "executionArn": ex.exec_arn,
            "stateMachineArn": ex.state_machine.arn,
            "name": ex.name,
            "status": ex.exec_status.value if ex.exec_status else "UNKNOWN",
            "startDate": epoch_ms(ex.start_date),
            "stopDate": epoch_ms(ex.stop_date) if ex.stop_date else None,
            "error": getattr(ex, "error", None),
            "cause": getattr(ex, "cause", None),
        }
        try:
            events_backends[ex.account_id][ex.region_name].put_events(
                [
                    {
                        "Source": "aws.states",
                        "DetailType": "Step Functions Execution Status Change",
                        "Detail": json.dumps(detail, default=str),
                        "Resources": [ex.exec_arn],
                    }
                ]
            )
        except Exception:  # an event that cannot be delivered must not break the execution's end
            logging.getLogger(__name__).exception("could not emit the execution status change")

    original_terminated = sfn_execution.BaseExecutionWorkerCommunication.terminated

    def terminated(self: Any) -> None:
        original_terminated(self)
        announce(self.execution)

    original_stop = sfn_execution.Execution.stop

    def stop(self: Any, stop_date: Any, error: str | None, cause: str | None) -> None:
        original_stop(self, stop_date, error, cause)
        if self.exec_status == ExecutionStatus.RUNNING:
            self.exec_status = ExecutionStatus.ABORTED
            self.stop_date = stop_date
            announce(self)

    sfn_execution.BaseExecutionWorkerCommunication.terminated = terminated
    sfn_execution.Execution.stop = stop


def install() -> None:
    _patch_stepfunctions()
    _patch_execution_events()
