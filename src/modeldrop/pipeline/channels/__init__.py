"""Channels: a stable endpoint per model line. What promotion, rollback and closing share
(`channel_context`); a promotion past the gate (`promotion`, its cases in `gate_cases`) and its
settling (`promotion_settle`), the state machine's promotion (`promotion_steps`), adapter-only
promotions (`adapter_promotion`), rollback and closing (`channel_admin`, `channel_close`), idle
channels (`idle_channel`), what a channel costs (`channel_cost`), the reaper's upkeep (`channel_upkeep`).

May import: `contracts`, `checkpoint`, `serving`, `evaluation`, `aws`, the `pipeline` package's own
modules, `pipeline.adapters`, `pipeline.deployment`.
"""
