"""Which cases a channel's gate judges a candidate by: the channel's own, pinned when it was created.

A request that creates a channel pins its eval set -- a direct start's own, or the built-in set when
the request came from a marker (anyone who can write to the bucket can write one). Every later gate
reads the pinned cases back and refuses a set changed since; only the channel's operator (the CLI's
`promote --eval-set`) pins another. A marker's `eval_set_uri` is its candidate's smoke eval, never the gate.
"""

from __future__ import annotations

from modeldrop.contracts.channel import EvalSetPin
from modeldrop.evaluation.eval_sets import default_eval_set, load_eval_set, pin_eval_set, pinned_cases
from modeldrop.evaluation.smoke_eval import EvalCase
from modeldrop.pipeline.channels.channel_context import ChannelContext, now_iso


def request_gate_cases(
    ctx: ChannelContext, channel_name: str, eval_set_uri: str | None, from_marker: bool
) -> tuple[list[EvalCase], EvalSetPin | None]:
    """The state machine's gate: the channel's pinned cases, or for a new channel the set it pins."""
    return _channel_cases(ctx, channel_name, None if from_marker else eval_set_uri)


def operator_gate_cases(
    ctx: ChannelContext, channel_name: str, eval_set: str | None
) -> tuple[list[EvalCase], EvalSetPin | None]:
    """The operator's gate (the CLI): a set given is pinned for the channel from now on when it is an
    s3:// object (a local file is used for this promotion alone: the state machine could not read it);
    none given, the channel's pinned cases (a new channel pins the built-in set)."""
    if eval_set and eval_set.startswith("s3://"):
        pin, cases = pin_eval_set(eval_set, ctx.s3, now_iso())
        return cases, pin
    if eval_set:
        return load_eval_set(eval_set), None
    return _channel_cases(ctx, channel_name, None)


def _channel_cases(
    ctx: ChannelContext, channel_name: str, new_channel_set: str | None
) -> tuple[list[EvalCase], EvalSetPin | None]:
    """The channel's pinned cases (the built-in set for a channel from before pins); a channel not created
    yet pins NEW_CHANNEL_SET (None: the built-in set)."""
    channel = ctx.channels.get(channel_name)
    if channel is None:
        pin, cases = pin_eval_set(new_channel_set, ctx.s3, now_iso())
        return cases, pin
    if channel.eval_set is None:
        return default_eval_set(), None
    return pinned_cases(channel.eval_set, ctx.s3), None
