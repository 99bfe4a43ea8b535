"""SageMaker and SageMaker Runtime: models, endpoint configs and endpoints (`sagemaker_resources`),
inference components (`inference_components`), the account's endpoint quota (`endpoint_quota`), the
execution role's trust policy (`execution_role`) and a call to a channel that may be asleep
(`channel_invoke`).

May import: `modeldrop.aws`'s shared modules (`pages`), `contracts`, `serving`.
"""
