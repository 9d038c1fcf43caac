"""qkv: the Transformer of "Attention Is All You Need", readable and fast."""

__version__ = "0.1.0"
