"""The small adapters behind every AWS call, one place per service as the emulator is
(`modeldrop.local.emulator`). Each takes the client it uses as an argument.

Here, what every service's adapter shares and the services one module holds:
- `clients`: every client the pipeline uses, typed, built once per Lambda container, one retry policy.
- `pages`: every page of a listing, through the SDK's own paginator.
- `events_bus` (EventBridge): modeldrop's lifecycle events.
- `execution_watch` (Step Functions): an execution followed state by state, from its history.
- `secret_refs` (Secrets Manager): secrets by reference, resolved only where they are used.
- `endpoint_logs` (CloudWatch Logs): what an endpoint's logs say about why it failed.

The services of several modules, each a package:
- `sagemaker/`: models, endpoint configs and endpoints; inference components; the endpoint quota; the
  execution role's trust; a call to a channel that may be asleep.
- `s3/`: artifact versions, the immutable served copy and its writer, checkpoint uploads, adapter archives.
- `dynamodb/`: the deployments table (`registry`, the only reader and writer of records), channel
  records, the stack-wide budget.
- `autoscaling/` (Application Auto Scaling and the CloudWatch alarms that drive it): a channel's
  scale-to-zero and its rollback alarms.

May import: `contracts`, `serving` (for instance data), `checkpoint.archive` (artifact version rules)
and boto3/botocore. The service packages import this package's shared modules and none of each other,
except `s3` and `sagemaker` reading `pages` and `dynamodb`'s budget through the registry.
"""
