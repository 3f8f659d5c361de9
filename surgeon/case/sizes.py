"""Memory sizes as people write them ("80GB", "40 GiB", "512MiB") and as surgeon prints them."""
from __future__ import annotations

import re

from surgeon.errors import SurgeonError

GiB = 2**30
_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9, "t": 1e12, "tb": 1e12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


MAX_BYTES = 2.0 ** 50  # 1 PiB: past any one device's memory


def parse_bytes(text: str, field: str = "--max-memory") -> int:
    """"80GB" (10^9), "40GiB" (2^30), "512MiB", "2e9" -> bytes; one error naming the option otherwise."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-z]*)\s*", str(text).lower())
    if not m or m.group(2) not in _UNITS or float(m.group(1)) <= 0:
        raise SurgeonError(f"cannot read the memory size {text!r}", field=field,
                           fix="write a size such as 80GB, 40GiB or 512MiB")
    size = float(m.group(1)) * _UNITS[m.group(2)]
    if not size < MAX_BYTES:  # inf included
        raise SurgeonError(f"the memory size {text!r} is more than any device holds (over 1 PiB)",
                           field=field, fix="give the memory of the device you run on, such as 80GB")
    return int(size)


def human(n: float) -> str:
    """Bytes as GiB, MiB or KiB, three significant figures."""
    if n >= GiB:
        return f"{n / GiB:.3g} GiB"
    return f"{n / 2**20:.3g} MiB" if n >= 2**20 else f"{n / 2**10:.3g} KiB"
