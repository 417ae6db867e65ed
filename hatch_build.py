"""Build the optional compiled engine (collectives/_engine.c) into the wheel, where a C compiler is found.

Without a compiler, or where the build fails, the wheel is the pure-Python one and
the package runs its Python path (``python -m collectives info`` says which runs).
``COLLECTIVES_BUILD_ENGINE=0`` skips the build.
"""

import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

SOURCE = Path("collectives") / "_engine.c"


def _compiler() -> list[str] | None:
    configured = shlex.split(sysconfig.get_config_var("CC") or "") or ["cc"]
    for command in (configured, ["cc"], ["gcc"], ["clang"]):
        if shutil.which(command[0]):
            return command
    return None


def compile_engine(root: Path, target: Path) -> str | None:
    """Compile the engine to ``target``; the reason it could not be, or ``None`` where it was."""
    compiler = _compiler()
    if compiler is None:
        return "no C compiler found"
    command = [
        *compiler,
        "-O3",
        "-std=c11",
        "-D_GNU_SOURCE",
        "-fPIC",
        "-shared",
        f"-I{sysconfig.get_paths()['include']}",
        str(root / SOURCE),
        "-o",
        str(target),
    ]
    if sys.platform == "darwin":
        command[1:1] = ["-undefined", "dynamic_lookup"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"{shlex.join(command)}: {error}"
    if done.returncode != 0:
        return f"{shlex.join(command)} failed:\n{done.stderr}"
    return None


class EngineBuildHook(BuildHookInterface):  # type: ignore[type-arg]
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel" or os.environ.get("COLLECTIVES_BUILD_ENGINE", "").strip() == "0":
            return
        root = Path(self.root)
        name = f"_engine{sysconfig.get_config_var('EXT_SUFFIX')}"
        if version == "editable":  # the checkout is on the path: the extension goes beside the source
            target = root / "collectives" / name
        else:
            target = Path(tempfile.mkdtemp(prefix="collectives-engine-")) / name
        problem = compile_engine(root, target)
        if problem is not None:
            self.app.display_warning(
                f"collectives: the compiled engine is not built ({problem}); the package runs its Python path"
            )
            return
        if version != "editable":
            build_data["force_include"][str(target)] = f"collectives/{name}"
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
