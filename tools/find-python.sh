#!/usr/bin/env bash
# Print a Python 3.13 (the Lambda runtime), else 3.12, for creating the project's venv.
for candidate in python3.13 "$(pyenv root 2>/dev/null)/versions/3.13.0/bin/python3" python3.12 "$(pyenv root 2>/dev/null)/versions/3.12.1/bin/python3"; do
  if [ -n "$candidate" ] && command -v "$candidate" >/dev/null 2>&1; then
    if "$candidate" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)' 2>/dev/null; then
      command -v "$candidate"
      exit 0
    fi
  fi
done
for dir in /root/.pyenv/versions/3.13* /root/.pyenv/versions/3.12*; do
  [ -x "$dir/bin/python3" ] && { echo "$dir/bin/python3"; exit 0; }
done
echo "python3.13 or python3.12 is required" >&2
exit 1
