"""The failures run-local can play out through the real state machine (`--fault NAME`).

Data only, so that the command line can list them without loading the emulator.
"""

from __future__ import annotations

FAULTS: dict[str, str] = {
    "none": "no fault",
    "oom": "the engine dies during load with a CUDA OOM line in its log: the endpoint goes Failed",
    "capacity": "the first instance type tried has no capacity (Failed: InsufficientInstanceCapacity); others do",
    "quota-busy": "the type's endpoint quota is 1, held by another team's endpoint deleted after 10 virtual min",
    "abort": "the execution is stopped (StopExecution) while the endpoint is Creating",
    "abort-mid-validate": (
        "the execution is stopped while ValidateCheckpoint is writing the served copy; the Lambda runs on, "
        "as on AWS (then the same artifact version is deployed again)"
    ),
    "abort-mid-create": (
        "the execution is stopped just after CreateEndpoint was accepted, before the step recorded it; the "
        "Lambda runs on (then the same artifact version is deployed again)"
    ),
    "abort-mid-attach": (
        "adapter_mode shared with 2 generated adapters: the execution is stopped just after PollEndpoint created "
        "the base inference component; the poll's Lambda runs on and finds its deployment ended"
    ),
    "engine-check-oom": (
        "the engine check's processes outgrow its memory bound (set to 64 MB for the run; needs the engine venv): "
        "the check is stopped, and the deployment fails EngineCheckFailed before anything is created"
    ),
    "engine-check-inactive": (
        "the engine check's image function has been idle for weeks (Inactive): its first two invocations fail "
        "CodeArtifactUserPendingException (Lambda is initializing it) and the next ResourceConflictException "
        "(Pending); the EngineCheck task retries until it answers and the deployment goes on"
    ),
    "slow-start": "the engine is still loading when the startup health check times out: Failed",
    "truncate": "the engine stops answers at 8 tokens with finish_reason=length",
    "throttle": "sagemaker-runtime throttles the first calls (retried with backoff)",
    "stream-break": "the engine dies in the middle of a streamed answer (ModelStreamError)",
    "create-throttle": "CreateEndpoint is throttled once after the model and config exist (the retry adopts them)",
    "finalize-error": "the first record write after the eval passed fails (retried: the endpoint is kept)",
    "teardown-throttle": "the engine runs out of memory, then DeleteEndpoint is throttled 10 times in a row",
    "reupload": "right after ValidateCheckpoint the artifact's key is overwritten with a corrupt archive",
    "untrusted-role": "the SageMaker execution role trusts only bedrock.amazonaws.com (RegisterDeployment refuses)",
    "delete-while-creating": (
        "SageMaker refuses DeleteEndpoint while an endpoint is Creating; with capacity, the first type's endpoint "
        "stays Creating with no instance for 45 virtual minutes before SageMaker gives up on it"
    ),
    "huge-archive": "S3 reports the archive as 140 GB: RegisterDeployment refuses it (ArchiveTooLarge) before any copy",
    "kill-mid-copy": (
        "the checkpoint is deployed as a prefix holding a 72 MiB file; the CopyShard Lambda copying it dies after "
        "3 part copies (its own abort never runs): the failure path aborts the incomplete upload"
    ),
    "adapter-load": (
        "adapter_mode shared with 2 generated adapters: the base's engine refuses to load the second adapter "
        "component (Failed); its components, then the base and the endpoint, are deleted in that order"
    ),
    "slow-component-delete": (
        "adapter_mode shared with 2 generated adapters; inference components take 4 virtual minutes to delete, and "
        "the execution is stopped during its smoke eval: ExecutionEnded releases the components within its 60 s "
        "and leaves the endpoint to the reaper, whose scheduled runs delete it once they are gone"
    ),
    "regression": (
        "run-local --channel (demo when none is named): the second version truncates every answer, which its own "
        "smoke eval tolerates; the champion/challenger gate blocks it (PromotionBlocked) and the first keeps serving"
    ),
    "alarm-during-bake": (
        "run-local --channel: the channel's 5XX alarm fires during the blue/green bake; SageMaker rolls back and "
        "the promotion fails (PromotionFailed) with the alarm named"
    ),
    "silent-rollback": (
        "run-local --channel: the update ends InService on the old config with no reason given; reading the "
        "config back makes it a failed promotion (PromotionFailed), never a success"
    ),
    "starter-error": "the S3 starter's StartExecution is refused (AccessDenied) on every try: the event lands in its "
    "failure queue",
    "slow-wake": "with `--idle`: provisioning an instance for the scaled-in channel takes hours; the client's wait "
    "(the plan's wake time) ends with ChannelAsleep and the candidate is refused, the channel left to wake on its "
    "own",
    "gate-scale-in": (
        "with `--idle` (and `regression`'s broken candidate): the channel is scaled in just after the gate's "
        "wake-up knock, so the champion answers none of the gate's cases; the gate says it cannot judge against "
        "silence and the candidate is not promoted (PromotionBlocked)"
    ),
    "zero-refused": "with `--idle`: the emulated region refuses MinInstanceCount 0 (as eu-west-3 does) and the stack "
    "lists it in NoScaleToZeroRegions: the channel runs always-on, its record saying why, before any resource is "
    "created",
}
