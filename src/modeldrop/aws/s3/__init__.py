"""S3: which version of an artifact a deployment is for (`artifact_version`), the immutable copy
SageMaker serves (`served_copy`) and the writer that fills it while validation streams
(`served_writer`), a checkpoint directory put as a prefix (`checkpoint_upload`), an adapter's files
packed as one archive (`adapter_archive`).

May import: `contracts`, `checkpoint.archive` (the archive rules' codes).
"""
