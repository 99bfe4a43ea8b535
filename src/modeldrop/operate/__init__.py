"""Operating a deployed stack from a workstation: deploy, list, status, extend, teardown, cost.

May import: `pipeline` and everything below it. Used by `cli`; not shipped in the Lambda layer.
"""
