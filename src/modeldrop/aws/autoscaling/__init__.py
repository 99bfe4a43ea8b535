"""Application Auto Scaling and the CloudWatch alarms around it: a channel that scales to zero
(`idle_scaling`) and the alarms its blue/green updates roll back on (`channel_alarms`).

May import: `contracts`.
"""
