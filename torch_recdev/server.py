"""The native ``recdev-server`` executable (csrc/server/main.cpp; no torch, no Python), built beside
``_C`` and installed on PATH. ``python -m torch_recdev.server ARGS`` runs it too; ``executable()`` is
its path, for code that starts servers (``local_shards``). Flags: docs/server.md."""

import os
import sys


def executable() -> str:
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "recdev-server")
    if not os.access(path, os.X_OK):
        raise FileNotFoundError(f"{path} is missing: build torch_recdev (make build, or "
                                "pip install --no-build-isolation -e .)")
    return path


def main(argv=None):
    os.execv(executable(), ["recdev-server", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    main()
