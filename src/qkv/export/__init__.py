"""Exports of trained runs to deployment engines (`pip install 'qkv[deploy]'`)."""

QUANTIZATIONS = ("int8", "int8_float32", "bfloat16", "float16")
"""CTranslate2's weight types that `qkv export` and the ctranslate2 engine offer."""
