"""Every option's vocabulary, read from the rows of the C header moe_options.h.

The header declares each table once (backends, scorings, activations with their Hugging
Face `hidden_act` names, dtypes, weight formats, the affine widths and group sizes, the
kernel specialisations) and the defaults of `moe_layer_desc_init`; this module reads the
text between its OPTIONS-BEGIN and OPTIONS-END markers, without loading the library, so
the NumPy reference can use it too.
"""

from __future__ import annotations

import re

from . import _native

_TEXT = _native.header_path("moe_options.h").read_text()
_SECTION = re.search(r"/\*\s*OPTIONS-BEGIN\s*\*/(.*?)/\*\s*OPTIONS-END\s*\*/", _TEXT, re.S).group(1)
# Each #define with its continuation lines joined, comments dropped.
_DEFINES = {
    m.group(1): m.group(2).strip()
    for m in re.finditer(r"^#define\s+(\w+)(?:\(X\))?[ \t]+((?:[^\n]*\\\n)*[^\n]*)",
                         re.sub(r"/\*.*?\*/", "", _SECTION, flags=re.S), re.M)
}


def _rows(table: str) -> list[list[str]]:
    """The arguments of each X(...) row of MOE_<table>_ROWS, as text."""
    body = _DEFINES[f"MOE_{table}_ROWS"].replace("\\\n", " ")
    return [[a.strip() for a in m.group(1).split(",")] for m in re.finditer(r"X\(([^)]*)\)", body)]


def _string(text: str) -> str:
    assert text.startswith('"') and text.endswith('"'), text
    return text[1:-1]


def _named(table: str) -> dict[str, int]:
    """name -> code of a table whose rows are X(NAME, code, "name", ...)."""
    return {_string(row[2]): int(row[1]) for row in _rows(table)}


BACKENDS = _named("BACKEND")
SCORINGS = _named("SCORING")
ACTIVATIONS = _named("ACTIVATION")
ACTIVATION_QUANTIZATIONS = _named("ACTIVATION_QUANTIZATION")
DTYPES = _named("DTYPE")
FORMATS = _named("FORMAT")
DTYPE_SIZES = {_string(row[2]): int(row[3]) for row in _rows("DTYPE")}
# Hugging Face hidden_act value -> activation name.
HIDDEN_ACT = {alias: _string(row[2]) for row in _rows("ACTIVATION") for alias in _string(row[3]).split()}
AFFINE_BITS = tuple(int(row[0]) for row in _rows("AFFINE_BITS"))
AFFINE_GROUP_SIZES = tuple(int(row[0]) for row in _rows("AFFINE_GROUP_SIZE"))
MXFP4_GROUP_SIZE = int(_DEFINES["MOE_MXFP4_GROUP_SIZE"])
# Elements per block of 8-bit activations (activation_quantization "q8").
Q8_ACTIVATION_BLOCK = int(_DEFINES["MOE_Q8_ACTIVATION_BLOCK"])
# Address and length alignment of memory whose weights a layer reads in place.
MAPPED_ALIGNMENT = int(_DEFINES["MOE_MAPPED_ALIGNMENT"])
# (suffix, format name, bits or 0 for any) per kernel specialisation, in row order; a row
# names its format by the FORMAT table's NAME.
_FORMAT_BY_NAME = {row[0]: _string(row[2]) for row in _rows("FORMAT")}
SPECIALISATIONS = tuple((row[0], _FORMAT_BY_NAME[row[1]], int(row[2])) for row in _rows("SPECIALISATION"))
# ggml type number -> (format name, elements per block, bytes per block), for the ggml
# tensor types the layer reads (GGUF files; the dense ones are float32/float16/bfloat16).
GGML_TYPES = {int(row[1]): (_FORMAT_BY_NAME[row[0]], int(row[2]), int(row[3])) for row in _rows("GGML_TYPE")}


# "MOE_SCORING_SOFTMAX" -> "softmax", for the defaults that name a row.
_ROW_NAMES = {f"MOE_{table}_{row[0]}": _string(row[2])
              for table in ("BACKEND", "SCORING", "ACTIVATION", "ACTIVATION_QUANTIZATION") for row in _rows(table)}


def _default(name: str):
    text = _DEFINES[f"MOE_DEFAULT_{name.upper()}"]
    if text in _ROW_NAMES:
        return _ROW_NAMES[text]
    return float(text.rstrip("f")) if "." in text else int(text)


# The defaults of moe_layer_desc_init, by option name (MoELayer's and the reference's).
DEFAULTS = {name: _default(name) for name in (
    "backend", "scoring", "norm_topk_prob", "routed_scaling_factor", "n_group", "topk_group",
    "activation", "swiglu_alpha", "swiglu_limit", "activation_quantization")}
DEFAULTS["norm_topk_prob"] = bool(DEFAULTS["norm_topk_prob"])


def cdef_enums() -> str:
    """The C enums of the tables as cffi declarations (cffi cannot expand the X-macros)."""
    out = []
    for table, c_name in (("BACKEND", "moe_backend"), ("SCORING", "moe_scoring"), ("ACTIVATION", "moe_activation"),
                          ("DTYPE", "moe_dtype"), ("FORMAT", "moe_format"),
                           ("ACTIVATION_QUANTIZATION", "moe_activation_quantization")):
        rows = ", ".join(f"MOE_{table}_{row[0]} = {int(row[1])}" for row in _rows(table))
        out.append(f"typedef enum {c_name} {{ {rows} }} {c_name};")
    return "\n".join(out) + "\n"
