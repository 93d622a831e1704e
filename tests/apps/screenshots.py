"""Screenshots of a virtual X screen: ``xwd -root`` read into an RGB array, and written as PNG
(zlib only) so that a failing run can be looked at."""

from __future__ import annotations

import struct
import subprocess
import zlib
from pathlib import Path

import numpy as np


def grab(display: str) -> np.ndarray:
    """The whole screen of ``display`` as (height, width, 3) uint8."""
    raw = subprocess.run(
        ["xwd", "-root", "-silent", "-display", display], capture_output=True, check=True,
        timeout=30,
    ).stdout  # fmt: skip
    fields = struct.unpack(">25I", raw[:100])
    header, width, height = fields[0], fields[4], fields[5]
    byte_order, bits_per_pixel, bytes_per_line, ncolors = (
        fields[7],
        fields[11],
        fields[12],
        fields[19],
    )
    assert bits_per_pixel == 32, f"expected a 32-bit screen, got {bits_per_pixel} bits"
    start = header + 12 * ncolors
    rows = np.frombuffer(raw, np.uint8, height * bytes_per_line, start).reshape(
        height, bytes_per_line
    )
    pixels = rows[:, : 4 * width].reshape(height, width, 4)
    return pixels[:, :, [2, 1, 0]] if byte_order == 0 else pixels[:, :, [1, 2, 3]]


def write_png(image: np.ndarray, path: Path) -> None:
    height, width, _ = image.shape
    data = b"".join(b"\0" + image[y].tobytes() for y in range(height))

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
        )

    png = b"\x89PNG\r\n\x1a\n" + chunk(
        b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    )
    path.write_bytes(png + chunk(b"IDAT", zlib.compress(data, 6)) + chunk(b"IEND", b""))


def distinct_colours(image: np.ndarray) -> int:
    packed = image.astype(np.uint32)
    return len(np.unique((packed[..., 0] << 16) | (packed[..., 1] << 8) | packed[..., 2]))
