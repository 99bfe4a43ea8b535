"""What an idle channel costs: the instance-hours it used, the spare instance its updates held."""

from __future__ import annotations

from modeldrop.contracts.channel import ChannelEvent, ChannelRecord


def test_an_updates_spare_instance_is_costed_from_the_claim_not_from_the_upload() -> None:
    """A promotion's event says how long since the candidate's upload (its own deployment included); the
    spare instance the update held counts only from the channel's claim to the version serving."""
    from datetime import UTC, datetime

    from modeldrop.contracts.channel import ChannelIdle
    from modeldrop.pipeline.channels.channel_cost import _update_hours

    idle = ChannelIdle(after_seconds=600, mode="scale_to_zero", component="modeldrop-ch-main")
    promoted = ChannelEvent(at="2026-12-07T12:00:00Z", kind="promoted", seconds=3600.0, change_seconds=360.0)
    channel = ChannelRecord(name="main", endpoint_name="modeldrop-ch-main", idle=idle, history=[promoted])
    day = datetime(2026, 12, 7, tzinfo=UTC)
    assert abs(_update_hours(channel, day, day.replace(hour=23)) - 0.1) < 1e-9
    older = channel.model_copy(update={"history": [promoted.model_copy(update={"change_seconds": None})]})
    assert abs(_update_hours(older, day, day.replace(hour=23)) - 1.0) < 1e-9  # never counted less
