"""What the steps agree on: the deployment request and every state payload (`models`), the domain
errors whose class names the state machine routes on (`errors`), the SageMaker hosting instance
types (`instance_types`, read from botocore's service model), S3 URIs (`s3uri`) and the one clock
every deadline reads (`clock`).

May import: pydantic, botocore's data loader and the standard library. Everything else may import this.
"""
