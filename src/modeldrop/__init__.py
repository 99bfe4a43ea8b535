"""modeldrop: ship a fine-tuned LLM to a SageMaker real-time endpoint, or leave nothing behind."""

__version__ = "0.1.0"
