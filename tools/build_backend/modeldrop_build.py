"""The build backend: setuptools', behind a check of the Python that builds.

pip resolves a project's dependencies before it reads its Requires-Python, so on too old a Python
`pip install .` ended in a resolver error hundreds of lines long that never named the version. Here
the build itself says it, in one line, before anything is resolved.
"""

import sys

if sys.version_info < (3, 12):  # noqa: UP036 -- the point: this runs on an older Python
    raise SystemExit(
        f"modeldrop needs Python 3.12 or newer (the Lambda runtime is 3.13); this is Python "
        f"{sys.version.split()[0]}: install it into a venv made with python3.12 or python3.13"
    )

from setuptools.build_meta import *  # noqa: F403
from setuptools.build_meta import __all__  # noqa: F401
