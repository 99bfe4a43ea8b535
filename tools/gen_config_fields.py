"""Generate src/modeldrop/checkpoint/data/config_fields.json: the type of every field transformers' strict
config classes declare, per model_type, as the engine venv's transformers defines them (run with the
engine venv's python: .venv-vllm/bin/python tools/gen_config_fields.py; --check exits 1 when the
committed file differs).

transformers 5 builds configs as strict dataclasses: `"hidden_size": 32.0`, `"use_cache": 1` or
`"rms_norm_eps": 1` is a TypeError at AutoConfig, before vLLM reads a weight. The table is that
library's own annotations, reduced to what a JSON value can be checked against; a type it cannot
express is `any` (not judged). model_types it holds are the ones AutoConfig resolves.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import types
import typing
from collections import Counter
from pathlib import Path

from generated_file import write_or_check

OUT = Path(__file__).resolve().parents[1] / "src" / "modeldrop" / "checkpoint" / "data" / "config_fields.json"
_SIMPLE = {int: "int", float: "float", bool: "bool", str: "str", type(None): "none", dict: "dict", list: "list"}


def _spell(tp: typing.Any) -> str:
    """A type as the checker's grammar: int, float, bool, str, none, dict, list, list[T], A|B, any."""
    if tp in _SIMPLE:
        return _SIMPLE[tp]
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        parts = sorted({_spell(a) for a in typing.get_args(tp)})
        return "any" if "any" in parts else "|".join(parts)
    if origin is list:
        args = typing.get_args(tp)
        inner = _spell(args[0]) if args else "any"
        return "list" if inner == "any" else f"list[{inner}]"
    if origin is dict:
        return "dict"
    if origin is typing.Literal:
        values = typing.get_args(tp)
        if all(isinstance(v, str) for v in values):
            return "str"
    return "any"


def table() -> dict[str, typing.Any]:
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING, CONFIG_MAPPING_NAMES

    models: dict[str, dict[str, str]] = {}
    for model_type in sorted(CONFIG_MAPPING_NAMES):
        try:
            cls = CONFIG_MAPPING[model_type]
        except Exception:  # a class the installed extras cannot import is not tabled
            continue
        if not dataclasses.is_dataclass(cls):
            models[model_type] = {}
            continue
        fields = {}
        for f in dataclasses.fields(cls):
            tp = f.type
            if isinstance(tp, str):
                try:
                    tp = typing.get_type_hints(cls).get(f.name, typing.Any)
                except Exception:  # an annotation that does not resolve is `any`
                    tp = typing.Any
            spelled = _spell(tp)
            if spelled != "any":
                fields[f.name] = spelled
        models[model_type] = fields
    counts = Counter((k, v) for fields in models.values() for k, v in fields.items())
    common = {}
    for (key, spelled), n in counts.items():
        if n * 2 > len(models) and counts[(key, spelled)] == max(c for (k, _), c in counts.items() if k == key):
            common[key] = spelled
    reduced = {
        mt: {k: v for k, v in fields.items() if common.get(k) != v} | {k: "-" for k in common if k not in fields}
        for mt, fields in models.items()
    }
    return {"transformers": transformers.__version__, "common": dict(sorted(common.items())), "models": reduced}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the committed file differs")
    args = parser.parse_args()
    text = json.dumps(table(), indent=0, sort_keys=True, separators=(",", ":")) + "\n"
    return write_or_check(OUT, text, args.check, ".venv-vllm/bin/python tools/gen_config_fields.py")


if __name__ == "__main__":
    sys.exit(main())
