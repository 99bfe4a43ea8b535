"""DynamoDB, the deployments table: deployment records (`registry`, their only reader and writer),
channel records (`channel_store`) and the stack-wide ceiling of price and instances (`stack_budget`).

May import: `contracts`.
"""
