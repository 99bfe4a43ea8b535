"""An artifact read once, without extracting it: a tar reader as strict as GNU tar (`tar_reader`,
`tar_pax`), a gzip reader as strict as GNU gzip (`gzip_stream`), parallel inflation
(`parallel_inflate`), the archive rules and their codes (`archive_rules`), what a scan gathers
(`scan_result`) and the scans of an archive (`tar_scan`) and of a directory, archive or S3 prefix
(`artifact_scan`).

May import: `contracts`, `checkpoint.headers`.
"""
