"""Request traces: the columnar `Trace` (`table`), its checks and text fields, the JSONL reader and
writer, real-trace formats (Azure, Mooncake, Vidur), synthetic generators and prefix block ids.
Imports only `kvsim.files` and third-party libraries (numpy); the rest of kvsim imports it.
"""
