"""The emulated account, sealed from the shell: AWS settings that point at a real account (or another
endpoint) are set aside while the emulated stack runs, and restored after."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator

# The shell's AWS settings point at a real account (or another endpoint): the emulated account ignores
# every one of them for the run, and gets them back after.
_SHELL_AWS = re.compile(
    r"^AWS_(ENDPOINT_URL.*|PROFILE|DEFAULT_PROFILE|ACCESS_KEY_ID|SECRET_ACCESS_KEY|SESSION_TOKEN|SECURITY_TOKEN|"
    r"CONFIG_FILE|SHARED_CREDENTIALS_FILE|CA_BUNDLE|USE_FIPS_ENDPOINT|USE_DUALSTACK_ENDPOINT|IGNORE_CONFIGURED_.*|"
    r"ROLE_ARN|WEB_IDENTITY_TOKEN_FILE|CONTAINER_.*|EC2_METADATA_.*)$"
)


@contextlib.contextmanager
def hermetic_aws() -> Iterator[None]:
    saved = {k: v for k, v in os.environ.items() if _SHELL_AWS.match(k)}
    for key in saved:
        del os.environ[key]
    os.environ.update({"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"})
    try:
        yield
    finally:
        for key in [k for k in os.environ if _SHELL_AWS.match(k)]:
            del os.environ[key]
        os.environ.update(saved)
