"""The scheduled reaper: managed endpoints past their expiry, what ended deployments left behind
(`reaper`), the orphan sweep (`reaper_orphans`) and what a run reports (`reap_model`). It runs every few
minutes with 256 MB: it imports no eval or template code.

May import: `contracts`, `aws`, the `pipeline` package's own modules, `pipeline.deployment`,
`pipeline.channels` (their light modules only).
"""
