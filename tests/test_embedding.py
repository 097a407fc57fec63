"""The README's embedding example runs as printed, against a real backend."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from pathlib import Path

from tests.helpers import TestBackend

ROOT = Path(__file__).resolve().parent.parent


def _readme_example() -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Embedding: the in-process bridge", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


async def test_the_readme_example_answers_through_the_bridge() -> None:
    async with TestBackend() as backend:
        code = _readme_example().replace("http://127.0.0.1:9000", backend.url)
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-c", code, cwd=ROOT, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE)
        out, err = await asyncio.wait_for(child.communicate(), 60)
    assert child.returncode == 0, err.decode()
    status, _, body = out.decode().strip().partition(" ")
    assert status == "200"
    assert "/hello" in body
