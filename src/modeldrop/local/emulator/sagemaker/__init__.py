"""Emulated SageMaker hosting: a real server process per endpoint (`hosting`, `hosted`), inference
components and their hosting (`components`, `component_hosting`), blue/green UpdateEndpoint as the
deployment guardrails run it (`endpoint_updates`), and the sagemaker-runtime endpoint (`runtime`)
framing streams as AWS does (`eventstream`). Start here for "how does the emulated SageMaker ...?"."""
