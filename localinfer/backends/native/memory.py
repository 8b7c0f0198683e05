"""How much anonymous (not file-backed) memory the process holds.

The weights are a file mapping, so anything the native engine adds on top of them shows
up here: KV cache pages, activations, tables.
"""

from __future__ import annotations

import psutil


def anon_rss_bytes() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    info = psutil.Process().memory_info()  # elsewhere: resident minus shared (file) pages
    return max(0, info.rss - getattr(info, "shared", 0))
