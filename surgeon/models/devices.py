"""Which device a run uses: the --device option (or device=) checked against this machine."""
from __future__ import annotations

from surgeon.errors import SurgeonError


def device_of(arg: str | None) -> str:
    """`arg` checked (cpu, cuda, cuda:N, mps; one error naming --device when this machine lacks it), or the
    default: cuda if available, else cpu."""
    import torch

    if arg:
        try:
            dev = torch.device(arg)
        except (RuntimeError, ValueError):
            raise SurgeonError(f"unknown device {arg!r}", field="--device", fix="use cpu, cuda, cuda:1 or mps") from None
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise SurgeonError("CUDA was asked for but is not available", field="--device", fix="use --device cpu")
        if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
            raise SurgeonError(f"there is no {arg} (this machine has {torch.cuda.device_count()} GPUs)", field="--device",
                               fix="use cuda:0 .. cuda:N-1")
        if dev.type == "mps" and not torch.backends.mps.is_available():
            raise SurgeonError("MPS was asked for but is not available", field="--device", fix="use --device cpu")
        if dev.type not in ("cpu", "cuda", "mps"):
            raise SurgeonError(f"device {arg!r} is not supported", field="--device", fix="use cpu, cuda, cuda:1 or mps")
        return arg
    return "cuda" if torch.cuda.is_available() else "cpu"
