"""The suite's vLLM engines leave no sockets in the temporary folder: they go in the session's own folder
(conftest.rpc_folder), which is removed at the end."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

from tests.vllm import conftest

UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")  # vLLM names its sockets so


def test_an_engine_leaves_no_sockets_in_the_temporary_folder(engine, rpc_folder):
    assert Path(tempfile.gettempdir()) != rpc_folder
    stray = [p for p in Path(tempfile.gettempdir()).iterdir()
             if UUID.match(p.name) and p.is_socket() and p.lstat().st_mtime >= conftest.STARTED]
    assert stray == []
