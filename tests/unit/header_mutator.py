"""A seeded generator of safetensors files with mutated headers, for the differential test.

Each case is a whole file (8-byte length, header, data). The header is written token by token so
that a mutation can put in what a JSON library would never write: `-0`, integers past 2^64,
duplicate keys, lone surrogate escapes, odd padding, deep nesting, bad lengths.
"""

from __future__ import annotations

import json
import random
import re
import struct

VALID_DTYPES = [
    "BOOL", "F4", "F6_E2M3", "F6_E3M2", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0", "F8_E4M3FNUZ",
    "F8_E5M2FNUZ", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "C64", "F64", "I64", "U64",
]  # fmt: skip
BITS = {"F4": 4, "F6_E2M3": 6, "F6_E3M2": 6}
U64 = 2**64


def _bits(dtype: str) -> int:
    table = {"BOOL": 8, "U8": 8, "I8": 8, "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32,
             "F32": 32, "C64": 64, "F64": 64, "I64": 64, "U64": 64}  # fmt: skip
    return table.get(dtype) or BITS.get(dtype) or 8


BAD_DTYPES = ['"f32"', '"F8"', '""', "1", "[]", "{}", "null", "true", '"BF16 "', '"Q4"']
ODD_INTS = ["-1", "-0", "0", "18446744073709551616", "18446744073709551615", "1.0", "2e0", '"2"', "true", "null",
            "[2]", "9" * 5000, "01", "+1", "1e999", "-0.0", "4294967296"]  # fmt: skip
NAMES = ['"a\\u0041"', '"\\ud83d\\ude00"', '"\\ud800"', '"\\udc00"', '"\\ud800\\u0041"', '"back\\\\slash"',
         '"q\\"uote"', '"ctl\x01"', '"bad\\x"', '"tab\\t"', '"e\u00e9"', '"__metadata__"']  # fmt: skip
PADDING = [" ", "\t", "\n", "\r", "\x00", "\ufeff", "  \n ", "x"]
NUMBERS = ["NaN", "Infinity", "-Infinity", "-0", "1e999", "9" * 400, "-9" * 3, "0.5"]


class Case:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        count = rng.randint(0, 4)
        self.tensors: list[dict[str, str]] = []
        offset = 0
        for i in range(count):
            dtype = rng.choice(VALID_DTYPES)
            dims = [rng.choice([1, 2, 3, 4, 8]) for _ in range(rng.randint(0, 3))]
            numel = 1
            for d in dims:
                numel *= d
            nbits = numel * _bits(dtype)
            if nbits % 8:
                dims = [*dims, 8] if dims else [8]
                nbits *= 8
            size = nbits // 8
            self.tensors.append(
                {
                    "name": json.dumps(f"t{i}"),
                    "dtype": json.dumps(dtype),
                    "shape": "[" + ",".join(map(str, dims)) + "]",
                    "offsets": f"[{offset},{offset + size}]",
                    "extra": "",
                }
            )
            offset += size
        self.data_len = offset
        self.metadata: str | None = '{"format":"pt"}' if rng.random() < 0.5 else None
        self.lead = ""
        self.trail = ""
        self.top: str | None = None
        self.length_delta = 0
        self.extra_keys: list[str] = []
        self.colon = ":"

    def header(self) -> bytes:
        if self.top is not None:
            return self.top.encode("utf-8", "surrogatepass")
        parts = []
        if self.metadata is not None:
            parts.append(f'"__metadata__":{self.metadata}')
        for t in self.tensors:
            body = f'"dtype":{t["dtype"]},"shape":{t["shape"]},"data_offsets":{t["offsets"]}{t["extra"]}'
            parts.append(f"{t['name']}{self.colon}{{{body}}}")
        parts.extend(self.extra_keys)
        text = self.lead + "{" + ",".join(parts) + "}" + self.trail
        return text.encode("utf-8", "surrogatepass")

    def blob(self) -> bytes:
        header = self.header()
        return struct.pack("<Q", max(len(header) + self.length_delta, 0)) + header + b"\0" * self.data_len


def _mutate(case: Case) -> None:
    rng = case.rng
    kind = rng.choice(
        ["dtype", "shape", "offsets", "metadata", "padding", "name", "nesting", "number", "length", "dup",
         "extra", "utf8", "top", "data", "overflow", "spacing", "escdup", "signs", "none"]
    )  # fmt: skip
    t = rng.choice(case.tensors) if case.tensors else None
    if kind == "dtype" and t:
        t["dtype"] = rng.choice(BAD_DTYPES + [json.dumps(d) for d in VALID_DTYPES])
    elif kind == "shape" and t:
        dims = t["shape"].strip("[]").split(",") if t["shape"] != "[]" else []
        dims = dims or ["1"]
        dims[rng.randrange(len(dims))] = rng.choice(ODD_INTS)
        t["shape"] = "[" + ",".join(dims) + "]"
    elif kind == "offsets" and t and re.fullmatch(r"\[\d+,\d+\]", t["offsets"]):
        begin, end = (int(x) for x in t["offsets"].strip("[]").split(","))
        t["offsets"] = rng.choice(
            [f"[{end},{begin}]", f"[{begin},{end + 1}]", f"[{begin + 1},{end + 1}]", f"[-0,{end}]", f"[{begin}]",
             f"[{begin},{end},{end}]", f'["{begin}",{end}]', f"[{begin}.0,{end}]", f"[{begin},{U64}]",
             f"[{begin}, {end}]", f"[{begin},-{end}]"]
        )  # fmt: skip
    elif kind == "metadata":
        case.metadata = rng.choice(
            ["null", "{}", '{"k":1}', '{"k":null}', "[]", '"s"', '{"k":"a","k":"b"}', '{"k":"\\ud800"}',
             '{"k":"v","n":"\\ud83d\\ude00"}', '{"k":["a"]}']
        )  # fmt: skip
    elif kind == "padding":
        if rng.random() < 0.5:
            case.lead = rng.choice(PADDING)
        else:
            case.trail = rng.choice(PADDING)
    elif kind == "name" and t:
        t["name"] = rng.choice(NAMES)
    elif kind == "nesting" and t:
        depth = rng.randint(122, 131)
        t["extra"] = ',"x":' + "[" * depth + "]" * depth
    elif kind == "number" and t:
        t["extra"] = ',"x":' + rng.choice(NUMBERS)
    elif kind == "length":
        case.length_delta = rng.choice([-1, 1, -3, 100])
    elif kind == "dup":
        if t and rng.random() < 0.5:
            t["extra"] = ',"dtype":' + t["dtype"]
        elif t:
            case.extra_keys.append(
                f'{t["name"]}:{{"dtype":{t["dtype"]},"shape":{t["shape"]},"data_offsets":{t["offsets"]}}}'
            )
        else:
            case.metadata = '{"a":"1"}'
            case.extra_keys.append('"__metadata__":{"b":"2"}')
    elif kind == "extra" and t:
        t["extra"] = rng.choice([',"x":1', ',"x":{"y":[1,2]}', ',"x":{"a":1,"a":2}', ',"x":"\\ud800"', ',"x":[]'])
    elif kind == "utf8":
        case.top = None
        case.trail = rng.choice(["\udcff", "\ud800"])  # lone surrogates, written raw (invalid UTF-8)
    elif kind == "top":
        case.top = rng.choice(["[]", '"x"', "1", "null", "{", "", "{}}", '{"a":}'])
    elif kind == "data":
        case.data_len += rng.choice([1, -1]) if case.data_len else 1
    elif kind == "overflow" and t:
        t["shape"] = rng.choice(["[4294967296,4294967296,0]", "[0,4294967296,4294967296]", "[18446744073709551615,2]",
                                 "[9223372036854775808,2]", "[18446744073709551616,0]"])  # fmt: skip
    elif kind == "spacing":
        # Whitespace before a colon hides a key from a naive count of `":`; with or without a duplicate.
        case.colon = rng.choice([" :", "\n:", "\t :", ":\n"])
        if t and rng.random() < 0.5:
            case.extra_keys.append(
                f'{t["name"]} :{{"dtype":{t["dtype"]},"shape":{t["shape"]},"data_offsets":{t["offsets"]}}}'
            )
    elif kind == "escdup" and t:
        # The same name spelled with escapes (a duplicate only a decoder sees), or a `\":` inside a name.
        name = json.loads(t["name"]) if t["name"].startswith('"t') else "t0"
        spelled = rng.choice(["".join(f"\\u{ord(c):04x}" for c in name), name + '\\":', name + "\\/"])
        case.extra_keys.append(
            f'"{spelled}":{{"dtype":{t["dtype"]},"shape":{t["shape"]},"data_offsets":{t["offsets"]}}}'
        )
    elif kind == "signs" and t and t["shape"].count(",") >= 1:
        # Two negative dims multiply to the right count; a bool reads as 1 in Python.
        dims = t["shape"].strip("[]").split(",")
        choice = rng.choice(["neg", "bool", "float"])
        if choice == "neg":
            dims[0], dims[1] = f"-{dims[0]}", f"-{dims[1]}"
        elif choice == "bool" and "1" in dims:
            dims[dims.index("1")] = "true"
        else:
            dims[0] = f"{dims[0]}.0"
        t["shape"] = "[" + ",".join(dims) + "]"


def cases(seed: int, count: int) -> list[bytes]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        case = Case(rng)
        for _ in range(rng.choice([0, 1, 1, 1, 2, 3])):
            _mutate(case)
        try:
            out.append(case.blob())
        except UnicodeEncodeError:
            continue
    return out
