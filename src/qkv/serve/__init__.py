"""`qkv serve`: trained runs behind HTTP (`pip install 'qkv[serve]'`)."""
