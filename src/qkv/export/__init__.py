"""Exports of trained runs to deployment engines (`pip install 'qkv[deploy]'`)."""
