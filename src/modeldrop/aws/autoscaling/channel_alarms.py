"""The CloudWatch alarms a channel's blue/green updates roll back on: invocation 5XX errors and
model latency on the channel's endpoint (AutoRollbackConfiguration names them)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mypy_boto3_cloudwatch import CloudWatchClient

# Average model latency (microseconds, as SageMaker reports it) past which the new fleet is rolled back:
# above the longest generation the 60 s invocation cap allows (48 s was seen for an allowed one), so that
# a model answering long is not taken for a broken one.
LATENCY_MICROSECONDS = 55_000_000
# 5XX errors per minute, in 2 of 3 minutes: one error (a client's bad request the container refused,
# a blip on the serving fleet before traffic moved) does not roll back a good candidate.
ERRORS_PER_MINUTE = 2.0


def put_channel_alarms(cw: CloudWatchClient, endpoint: str) -> list[str]:
    """Create (or overwrite) the channel's two alarms; returns their names."""
    dimensions = [{"Name": "EndpointName", "Value": endpoint}, {"Name": "VariantName", "Value": "AllTraffic"}]
    alarms = {
        f"{endpoint}-5xx": (
            "Invocation5XXErrors",
            "Sum",
            ERRORS_PER_MINUTE,
            "over 2 5XX a minute, 2 of 3 minutes",
        ),
        f"{endpoint}-latency": ("ModelLatency", "Average", float(LATENCY_MICROSECONDS), "model latency over 55 s"),
    }
    for name, (metric, statistic, threshold, what) in alarms.items():
        cw.put_metric_alarm(
            AlarmName=name,
            AlarmDescription=f"modeldrop channel rollback alarm: {what}",
            Namespace="AWS/SageMaker",
            MetricName=metric,
            Dimensions=dimensions,
            Statistic=statistic,
            Period=60,
            EvaluationPeriods=3,
            DatapointsToAlarm=2,
            Threshold=threshold,
            ComparisonOperator="GreaterThanThreshold",
            TreatMissingData="notBreaching",
        )
    return list(alarms)


def alarms_in_alarm(cw: CloudWatchClient, names: list[str]) -> list[str]:
    if not names:
        return []
    found = cw.describe_alarms(AlarmNames=names, StateValue="ALARM")["MetricAlarms"]
    # Filtered here too: an implementation that ignores StateValue beside AlarmNames must not say ALARM.
    return sorted(a["AlarmName"] for a in found if a.get("StateValue") == "ALARM")


def delete_alarms(cw: CloudWatchClient, names: list[str]) -> None:
    if names:
        cw.delete_alarms(AlarmNames=names)
