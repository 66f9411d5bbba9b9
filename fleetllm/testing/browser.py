"""Headless Chromium (Debian's `chromium`) rendering a page to a PNG, as a person would see it."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars"]


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def screenshot(page: str | Path, png: str | Path, width: int = 1400, height: int = 1800,
               timeout_s: float = 120) -> Path:
    """Render the local HTML file `page` to `png` (a fresh profile each time); returns the PNG's path."""
    exe = chromium()
    if exe is None:
        raise RuntimeError("chromium is not installed; `apt-get install chromium` (make test does)")
    png = Path(png).resolve()
    with tempfile.TemporaryDirectory(prefix="fleetllm-chromium-") as profile:
        proc = subprocess.run([exe, *FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}",
                               f"--screenshot={png}", Path(page).resolve().as_uri()],
                              capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0 or not png.exists():
        raise RuntimeError(f"chromium failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return png
