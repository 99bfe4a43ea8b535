"""Emulated S3: where moto 5.2.5 is laxer than the service (`shims`) and object bodies kept in files
so that a multi-GB artifact never sits in memory (`file_backed`)."""
