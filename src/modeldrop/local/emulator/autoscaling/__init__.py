"""Application Auto Scaling in the emulator, with the CloudWatch alarms that drive it (`scaling`): the
inference-component copy count moto lacks, held to AWS's reference, and evaluated on the emulator's
clock from the metrics the emulated SageMaker publishes to it."""
