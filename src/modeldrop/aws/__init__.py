"""The small adapters behind every AWS call: SageMaker resources, the endpoint quota, endpoint logs,
the deployments table (`registry`), lifecycle events, secrets by reference, Step Functions
executions, and artifact versions in S3. Each takes the client it uses as an argument.

May import: `contracts`, `serving` (for instance data) and boto3/botocore.
"""
