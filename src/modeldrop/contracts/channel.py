"""A channel: one stable endpoint per model line, its live version, the versions kept for a
rollback until their grace period ends, and the promotion history. Stored in the deployments
table under `channel#NAME` (never listed as a deployment), written only with the revision read."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

CHANNEL_PREFIX = "channel#"
CHANNEL_PATTERN = r"^[a-z0-9](-?[a-z0-9]){0,23}$"
EventKind = Literal["created", "promoted", "blocked", "rolled_back", "promotion_failed", "retired"]

# The idle alarm counts invocations per minute; CloudWatch evaluates at most a day of 60-second periods
# (EvaluationPeriods x Period <= 86400), and under 5 minutes a client's think time would wake it again.
MIN_IDLE_SECONDS = 300
MAX_IDLE_SECONDS = 86_400
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min|h|hr|d)?\s*$", re.IGNORECASE)
_UNIT = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hr": 3600, "d": 86400}


def parse_idle(text: str | int | float) -> int:
    """Seconds from `10m`, `1h`, `90s`, `1.5h` or a number of seconds; ValueError says what is wrong."""
    if isinstance(text, bool):
        raise ValueError("an idle period is a duration such as 10m or 1h")
    if isinstance(text, int | float):
        seconds = float(text)
    else:
        match = _DURATION.match(str(text)[:40])
        if match is None:
            raise ValueError(f"idle period {str(text)[:40]!r}: a duration such as 10m, 1h or 90s")
        seconds = float(match.group(1)) * _UNIT[(match.group(2) or "s").lower()]
    if not MIN_IDLE_SECONDS <= seconds <= MAX_IDLE_SECONDS:
        bare = not isinstance(text, str) or text.strip().replace(".", "", 1).isdigit()
        unit = (
            f" (a bare number is seconds: did you mean {text}m or {text}h?)"
            if bare and seconds < MIN_IDLE_SECONDS
            else ""
        )
        raise ValueError(
            f"idle period {seconds:g} s: between {MIN_IDLE_SECONDS // 60} minutes and {MAX_IDLE_SECONDS // 3600} "
            f"hours (the idle alarm's minutes of no invocation){unit}"
        )
    return int(seconds // 60 * 60)  # whole minutes: the alarm's 60-second periods


class IdleRequest(BaseModel):
    """A request's idle policy for the channel it creates."""

    model_config = ConfigDict(extra="forbid")

    scale_to_zero_after: str | int = Field(
        description="how long without an invocation before the channel scales to zero: 10m, 1h, 90m (5 min to 24 h)"
    )

    @field_validator("scale_to_zero_after")
    @classmethod
    def _duration(cls, value: str | int) -> str | int:
        parse_idle(value)
        return value

    @property
    def seconds(self) -> int:
        return parse_idle(self.scale_to_zero_after)


class ChannelVersion(BaseModel):
    deployment_id: str
    endpoint_config: str = ""  # empty for an adapter version: the base's endpoint config is not the version's
    models: list[str] = Field(default_factory=list)
    component: str | None = None  # an adapter version: its inference component on the channel's base
    adapter: str | None = None
    artifact_uri: str | None = None
    served_at: str | None = None  # when it began serving the channel
    retired_at: str | None = None  # when another version replaced it
    remove_after: str | None = None  # its config and models are deleted after this (the grace period)


class EvalSetPin(BaseModel):
    """The cases a channel's gate judges by, pinned by content when the channel was created (or by its
    operator since): a marker names no eval set for the gate, and an overwritten object is refused."""

    source: str | None = None  # an s3:// URI; None: the built-in set
    version_id: str | None = None  # the S3 version read, where the bucket keeps versions
    sha256: str
    cases: int
    pinned_at: str


class ChannelEvent(BaseModel):
    at: str
    kind: EventKind
    deployment_id: str | None = None
    previous: str | None = None  # the deployment serving before
    reason: str = ""
    seconds: float | None = None  # from the request to the version serving (or the refusal)
    change_seconds: float | None = None  # from the channel's claim to the version serving: the endpoint's change
    gate: dict[str, object] | None = None  # the champion/challenger report
    drift: list[str] = Field(default_factory=list)  # what changed in the chat contract (template, EOS, ...)


class PendingPromotion(BaseModel):
    """The channel's claim while its endpoint changes: being created or updated onto VERSION (a
    promotion), or rolled back onto it. The check that finds it settled (the CLI's loop, the state
    machine's, or the reaper's past the budget) completes or refuses it; until then the channel is busy."""

    version: ChannelVersion
    event: ChannelEvent  # the history entry it becomes, with the gate's report
    phase: Literal["creating", "updating", "rolling_back", "closing"]
    started_at: str
    grace_seconds: float = 3600.0
    instances: int = 1
    # How long the change may take before a check gives up on it: the endpoint's deployment timeout
    # (from the candidate's own plan: provisioning, download, start-up, bake) and a margin.
    budget_seconds: float = 3600.0
    update_timeout_seconds: int | None = None  # the UpdateEndpoint's MaximumExecutionTimeoutInSeconds


class ChannelIdle(BaseModel):
    """A channel's idle policy as it was decided: scaled to zero after AFTER_SECONDS without an invocation
    (an endpoint of inference components, its one stable COMPONENT holding the live version's model), or
    always-on where that cannot be had (REASON says why)."""

    after_seconds: int
    mode: Literal["scale_to_zero", "always_on"]
    reason: str = ""
    region: str = ""
    instance_type: str = ""
    max_instances: int = 1
    hourly_price: float | None = None
    wake_seconds: int = 0  # how long a client retries the waking error (provisioning + download + start-up)
    component: str | None = None  # scale_to_zero: the component clients name
    endpoint_config: str | None = None  # scale_to_zero: the channel endpoint's own config
    since: str | None = None  # when the policy began (the channel's creation)


class ChannelRecord(BaseModel):
    name: str
    endpoint_name: str
    alarms: list[str] = Field(default_factory=list)
    live: ChannelVersion | None = None
    kept: list[ChannelVersion] = Field(default_factory=list)  # superseded, newest first, within grace
    history: list[ChannelEvent] = Field(default_factory=list)
    candidate: PendingPromotion | None = None  # while a promotion's (or a rollback's) endpoint work is under way
    eval_set: EvalSetPin | None = None  # the gate's cases (None: a channel from before pins; the built-in set)
    # An adapter channel: the shared deployment whose endpoint and base component its adapters run on
    # (clients call the endpoint with the live version's component name).
    base_deployment: str | None = None
    idle: ChannelIdle | None = None  # an idle policy (request `idle`): scaled to zero, or always-on and why
    revision: int = 0

    @property
    def scales_to_zero(self) -> bool:
        return self.idle is not None and self.idle.mode == "scale_to_zero" and bool(self.idle.component)

    @property
    def adapter_only(self) -> bool:
        return self.base_deployment is not None

    def invoke_target(self) -> dict[str, str]:
        """What clients call: the endpoint, and for an adapter channel the live component."""
        target = {"EndpointName": self.endpoint_name}
        if self.live is not None and self.live.component:
            target["InferenceComponentName"] = self.live.component
        elif self.scales_to_zero and self.idle and self.idle.component:
            target["InferenceComponentName"] = self.idle.component
        return target

    def last_known_good(self) -> ChannelVersion | None:
        """The version a rollback returns to: the newest kept one."""
        return self.kept[0] if self.kept else None

    def _versions(self) -> list[ChannelVersion]:
        """Live, kept, and the one a promotion under way is moving onto."""
        pending = [self.candidate.version] if self.candidate else []
        return ([self.live] if self.live else []) + self.kept + pending

    def holds(self) -> set[str]:
        """Every endpoint config and model the channel still needs (live and kept)."""
        names: set[str] = set()
        for version in self._versions():
            names.update(n for n in (version.endpoint_config, version.component) if n)
            names.update(version.models)
        if self.idle is not None:
            names.update(n for n in (self.idle.component, self.idle.endpoint_config) if n)
        return names

    def deployments(self) -> set[str]:
        """Every deployment the channel holds: its versions', and an adapter channel's base."""
        held = {v.deployment_id for v in self._versions()}
        return held | ({self.base_deployment} if self.base_deployment else set())


def channel_endpoint_name(resource_prefix: str, channel: str) -> str:
    """The channel's stable endpoint name, under the stack's prefix (the only names its roles act on)."""
    return f"{resource_prefix}-ch-{channel}"


def channel_problem(name: str) -> str | None:
    """Why NAME cannot name a channel, or None."""
    if re.match(CHANNEL_PATTERN, name):
        return None
    return f"channel name {name[:40]!r}: 1-24 of a-z, 0-9 and single dashes (it is part of the endpoint's name)"
