"""The host a deployment runs on: the inference AMI and its driver for the image and the family."""

from __future__ import annotations


def test_an_image_whose_tag_names_no_cuda_gets_the_newest_ami_of_the_family() -> None:
    from modeldrop.serving.host import choose_host

    chosen = choose_host("123456789012.dkr.ecr.us-east-1.amazonaws.com/my-vllm:latest", "ml.g6e.2xlarge")
    assert chosen.inference_ami_version == "al2023-ami-sagemaker-inference-gpu-4-1" and chosen.driver == 580
    assert "not in its tag" in chosen.note


def test_g7e_is_in_the_catalog_on_the_only_ami_whose_driver_runs_blackwell() -> None:
    from modeldrop.serving.host import choose_host, gpu_arch
    from modeldrop.serving.memory_plan import hourly_price

    chosen = choose_host("763104351884.dkr.ecr.us-east-1.amazonaws.com/vllm:0.26.0-gpu-py312-cu130-x", "ml.g7e.2xlarge")
    assert chosen.inference_ami_version == "al2023-ami-sagemaker-inference-gpu-4-1"
    assert gpu_arch("RTX PRO Server 6000") == "sm_120" and hourly_price("ml.g7e.2xlarge", "us-east-1") is None
