"""Emulated IAM, all of it: policy evaluation as AWS documents it (`policy`), the Service Authorization
Reference as the model every request is held to (`sar`, data/iam_sar.json), what each AWS call asks
of IAM (`calls`), enforcement of template.yaml's statements on every call a function makes
(`enforcement`), and SimulatePrincipalPolicy (`simulator`). Knows no other service's internals:
resources moto lacks register their tag tables with `enforcement.register_tag_table`."""
